//! "Did you mean" suggestions by edit distance.

use std::cell::Cell;

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
    did_you_mean_within(name, candidates, &Cell::new(usize::MAX))
}

/// Cells of edit distance (the product of two names' lengths) that one
/// workflow's check measures for its suggestions, about a quarter of a
/// second: a name misspelt among 100,000 step ids is measured against each,
/// and 5,000 misspelt recipe names among 5,000 recipes (34 s) stop being
/// measured once it is spent.
pub const SUGGESTION_CELLS: usize = 50_000_000;

/// [`did_you_mean`] that measures at most `budget` cells of edit distance
/// and takes what it measures from it. A check shares one budget among its
/// suggestions, so that thousands of misspelt names among thousands of
/// candidates take a bounded time. A call measures all its candidates or
/// none (then a name is suggested only as the other cut short): measuring
/// some would suggest a farther name for want of the nearest, and which,
/// by the order of a hash map's keys.
pub fn did_you_mean_within<'c>(
    name: &str,
    candidates: impl IntoIterator<Item = &'c str>,
    budget: &Cell<usize>,
) -> Option<&'c str> {
    use flow_plan::limits::MAX_NAME_BYTES;
    let length = name.chars().count();
    let limit = (length / 3).max(1);
    let candidates: Vec<(&str, usize)> = candidates
        .into_iter()
        .filter(|candidate| *candidate != name)
        .map(|candidate| (candidate, candidate.chars().count()))
        .collect();
    let measurable = |candidate: &str, candidate_length: usize| {
        name.len() <= MAX_NAME_BYTES
            && candidate.len() <= MAX_NAME_BYTES
            && candidate_length.abs_diff(length) <= limit
    };
    let cells = candidates
        .iter()
        .filter(|(candidate, candidate_length)| measurable(candidate, *candidate_length))
        .fold(0usize, |cells, (_, candidate_length)| {
            cells.saturating_add(length.saturating_mul(*candidate_length))
        });
    let measure = cells <= budget.get();
    if measure {
        budget.set(budget.get() - cells);
    }
    candidates
        .into_iter()
        .filter_map(|(candidate, candidate_length)| {
            // A name cut short (`ticket` for `ticket_id`) is a likely mistake
            // too, however many characters are missing.
            let truncated =
                name.len() >= 3 && (candidate.starts_with(name) || name.starts_with(candidate));
            let distance = if measure && measurable(candidate, candidate_length) {
                strsim::damerau_levenshtein(name, candidate)
            } else if truncated {
                // One is the other cut short: the distance is what is cut.
                candidate_length.abs_diff(length)
            } else {
                usize::MAX
            };
            (distance <= limit || truncated).then_some((distance, candidate))
        })
        .min_by_key(|(distance, candidate)| (*distance, *candidate))
        .map(|(_, candidate)| candidate)
}

/// A short, sorted list of candidates for a hint: `a`, `b`, `c` (and N more).
///
/// The first names are picked, not the whole list sorted: each of thousands
/// of errors among thousands of candidates sorted them all.
pub fn candidates_list<'c>(candidates: impl IntoIterator<Item = &'c str>) -> String {
    const SHOWN: usize = 12;
    let distinct: std::collections::HashSet<&str> = candidates.into_iter().collect();
    let mut names: Vec<&str> = distinct.iter().copied().collect();
    if names.len() > SHOWN {
        names.select_nth_unstable(SHOWN);
        names.truncate(SHOWN);
    }
    names.sort_unstable();
    let mut text = names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if distinct.len() > SHOWN {
        text.push_str(&format!(" and {} more", distinct.len() - SHOWN));
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

    /// A call measures all its candidates or none; a spent budget measures
    /// nothing more, and only a name cut short is still suggested.
    #[test]
    fn a_spent_budget_suggests_by_prefix_only() {
        let names = ["summary", "category"];
        // 6 x 7 cells for `summary`, 6 x 8 for `category`.
        let budget = Cell::new(6 * 7 + 6 * 8 - 1);
        assert_eq!(did_you_mean_within("sumary", names, &budget), None);
        let budget = Cell::new(6 * 7 + 6 * 8);
        assert_eq!(
            did_you_mean_within("sumary", names, &budget),
            Some("summary")
        );
        assert_eq!(budget.get(), 0);
        assert_eq!(did_you_mean_within("categroy", names, &budget), None);
        assert_eq!(
            did_you_mean_within("categ", names, &budget),
            Some("category")
        );
    }

    #[test]
    fn lists_are_sorted_and_bounded() {
        assert_eq!(candidates_list(["b", "a", "b"]), "`a`, `b`");
        let many: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        assert!(candidates_list(many.iter().map(String::as_str)).ends_with("and 8 more"));
    }
}
