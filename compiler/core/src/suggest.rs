//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `name`, if it is close enough to be a likely typo:
/// at most one edit for short names, a third of the length for longer ones.
///
/// The edit distance costs the product of the two lengths, so it is worked
/// out only for names people type (up to [`MAX_NAME_BYTES`]) and for
/// candidates whose length is within the limit of the name's: a misspelt
/// name of 100,000 bytes beside the one it meant took minutes.
///
/// [`MAX_NAME_BYTES`]: flow_plan::limits::MAX_NAME_BYTES
pub fn did_you_mean<'c>(
    name: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    use flow_plan::limits::MAX_NAME_BYTES;
    let length = name.chars().count();
    let limit = (length / 3).max(1);
    candidates
        .into_iter()
        .filter(|candidate| *candidate != name)
        .filter_map(|candidate| {
            // A name cut short (`ticket` for `ticket_id`) is a likely mistake
            // too, however many characters are missing.
            let truncated =
                name.len() >= 3 && (candidate.starts_with(name) || name.starts_with(candidate));
            let close_in_length = name.len() <= MAX_NAME_BYTES
                && candidate.len() <= MAX_NAME_BYTES
                && candidate.chars().count().abs_diff(length) <= limit;
            let distance = if close_in_length {
                strsim::damerau_levenshtein(name, candidate)
            } else if truncated {
                // One is the other cut short: the distance is what is cut.
                candidate.chars().count().abs_diff(length)
            } else {
                usize::MAX
            };
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

    /// Regression: the edit distance of two names of 100,000 bytes (a
    /// misspelt long name beside the one it meant) took minutes. Names past
    /// what a plan holds are matched by prefix only, and a candidate too
    /// long or too short to be within the limit is not measured.
    #[test]
    fn long_names_are_not_measured() {
        let long = "a".repeat(100_000);
        let meant = format!("{long}x");
        assert_eq!(did_you_mean(&format!("{long}y"), [meant.as_str()]), None);
        assert_eq!(did_you_mean(&long, [meant.as_str()]), Some(meant.as_str()));
        assert_eq!(did_you_mean("step_one", [long.as_str()]), None);
    }

    #[test]
    fn lists_are_sorted_and_bounded() {
        assert_eq!(candidates_list(["b", "a", "b"]), "`a`, `b`");
        let many: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        assert!(candidates_list(many.iter().map(String::as_str)).ends_with("and 8 more"));
    }
}
