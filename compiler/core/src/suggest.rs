//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `name`, if it is close enough to be a likely typo:
/// at most one edit for short names, a third of the length for longer ones.
pub fn did_you_mean<'c>(
    name: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|candidate| *candidate != name)
        .filter_map(|candidate| {
            let distance = strsim::damerau_levenshtein(name, candidate);
            // A name cut short (`ticket` for `ticket_id`) is a likely mistake
            // too, however many characters are missing.
            let truncated =
                name.len() >= 3 && (candidate.starts_with(name) || name.starts_with(candidate));
            (distance <= limit || truncated).then_some((distance, candidate))
        })
        .min_by_key(|(distance, candidate)| (*distance, *candidate))
        .map(|(_, candidate)| candidate)
}

/// A short, sorted list of candidates for a hint: `a`, `b`, `c` (and N more).
pub fn candidates_list<'c>(candidates: impl IntoIterator<Item = &'c str>) -> String {
    let mut names: Vec<&str> = candidates.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    const SHOWN: usize = 12;
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let names = ["summary", "category", "urgency"];
        assert_eq!(did_you_mean("sumary", names), Some("summary"));
        assert_eq!(did_you_mean("urgnecy", names), Some("urgency"));
        assert_eq!(did_you_mean("title", names), None);
        assert_eq!(did_you_mean("x", ["y", "xy"]), Some("xy"));
        assert_eq!(
            did_you_mean("ticket", ["ticket_id", "subject"]),
            Some("ticket_id")
        );
    }

    #[test]
    fn lists_are_sorted_and_bounded() {
        assert_eq!(candidates_list(["b", "a", "b"]), "`a`, `b`");
        let many: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        assert!(candidates_list(many.iter().map(String::as_str)).ends_with("and 8 more"));
    }
}
