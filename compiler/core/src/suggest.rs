//! "Did you mean" suggestions by edit distance, and lists of the names in
//! scope for hints.
//!
//! Both cost time in the number of candidates, and an error may be repeated
//! thousands of times among thousands of candidates: a check shares one
//! [`Budget`] among its suggestions and lists, so that their time is bounded
//! whatever the program.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Work that a check may spend on suggestions, in cells: a cell of edit
/// distance (the product of two names' lengths), or a byte of a candidate
/// listed. 50 M cells take about a quarter of a second: a name misspelt
/// among 100,000 step ids is measured against each, and 5,000 misspelt
/// recipe names among 5,000 recipes (34 s) stop being measured once it is
/// spent.
pub const SUGGESTION_CELLS: usize = 50_000_000;

/// What is left of a check's [`SUGGESTION_CELLS`]. Atomic rather than a
/// `Cell` because the declarations' budget lives in [`crate::check::Env`],
/// which editors share between threads.
#[derive(Debug)]
pub struct Budget(AtomicUsize);

impl Budget {
    pub const fn new(cells: usize) -> Budget {
        Budget(AtomicUsize::new(cells))
    }

    /// No bound, for candidates a program cannot multiply (built-in names,
    /// a folder's entries).
    pub const fn unlimited() -> Budget {
        Budget::new(usize::MAX)
    }

    pub fn left(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Takes `cells` if that many are left: all or nothing.
    pub fn spend(&self, cells: usize) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(cells)
            })
            .is_ok()
    }

    /// Lists `candidates` if the budget pays a cell for each byte of them
    /// (and one each); otherwise spends what is left and lists none. The
    /// walk stops where the budget would, so that a spent budget costs a
    /// caller nothing however many candidates it has.
    fn list<'c>(&self, candidates: impl IntoIterator<Item = &'c str>) -> Option<Vec<&'c str>> {
        let left = self.left();
        let mut cost = 0usize;
        let mut listed = Vec::new();
        // An empty name (a declaration whose name is missing, an error of
        // its own) is neither suggested nor listed.
        for candidate in candidates.into_iter().filter(|c| !c.is_empty()) {
            cost = cost.saturating_add(candidate.len() + 1);
            if cost > left {
                self.0.store(0, Ordering::Relaxed);
                return None;
            }
            listed.push(candidate);
        }
        self.spend(cost).then_some(listed)
    }
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::new(SUGGESTION_CELLS)
    }
}

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
    did_you_mean_within(name, candidates, &Budget::unlimited())
}

/// [`did_you_mean`] within `budget`, which pays for listing the candidates
/// (without it, nothing is suggested) and then for measuring them. A call
/// measures all its candidates or none (then a name is suggested only as
/// the other cut short): measuring some would suggest a farther name for
/// want of the nearest, and which, by the order of a hash map's keys.
pub fn did_you_mean_within<'c>(
    name: &str,
    candidates: impl IntoIterator<Item = &'c str>,
    budget: &Budget,
) -> Option<&'c str> {
    use flow_plan::limits::MAX_NAME_BYTES;
    let length = name.chars().count();
    let limit = (length / 3).max(1);
    let candidates: Vec<(&str, usize)> = budget
        .list(candidates)?
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
    let measure = budget.spend(cells);
    candidates
        .into_iter()
        .filter_map(|(candidate, candidate_length)| {
            // A name cut short (`ticket` for `ticket_id`) is a likely mistake
            // too, however many characters are missing.
            let truncated = name.len().min(candidate.len()) >= 3
                && (candidate.starts_with(name) || name.starts_with(candidate));
            let distance = if measure && measurable(candidate, candidate_length) {
                strsim::damerau_levenshtein(name, candidate)
            } else if truncated {
                // One is the other cut short: the distance is what is cut.
                candidate_length.abs_diff(length)
            } else {
                usize::MAX
            };
            // A name must keep a character of its own: any one letter is
            // one edit from any other (`c` is not a slip of `h`).
            (truncated || (distance <= limit && distance < length.max(candidate_length)))
                .then_some((distance, candidate))
        })
        .min_by_key(|(distance, candidate)| (*distance, *candidate))
        .map(|(_, candidate)| candidate)
}

/// How many items a message or a hint lists before `and N more`.
const SHOWN: usize = 12;

/// Items in their order for a message: the first [`SHOWN`], then
/// `and N more`. An enum of 10,000 variants listed in full made each
/// message about it 80 KB.
pub(crate) fn shown_list(items: impl ExactSizeIterator<Item = String>) -> String {
    let total = items.len();
    let mut text = items.take(SHOWN).collect::<Vec<_>>().join(", ");
    if total > SHOWN {
        text.push_str(&format!(" and {} more", total - SHOWN));
    }
    text
}

/// A short, sorted list of candidates for a hint: `a`, `b`, `c` (and N more).
///
/// The first names are picked, not the whole list sorted: each of thousands
/// of errors among thousands of candidates sorted them all.
pub fn candidates_list<'c>(candidates: impl IntoIterator<Item = &'c str>) -> String {
    candidates_list_within(candidates, &Budget::unlimited()).unwrap_or_default()
}

/// [`candidates_list`] if `budget` pays for listing the candidates; a hint
/// that would list them is left out otherwise.
pub fn candidates_list_within<'c>(
    candidates: impl IntoIterator<Item = &'c str>,
    budget: &Budget,
) -> Option<String> {
    let distinct: std::collections::HashSet<&str> = budget.list(candidates)?.into_iter().collect();
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
    Some(text)
}

/// `diagnostic` with the hint `{lead} `a`, `b` (and N more)` listing
/// `candidates`, if `budget` pays for listing them; as it is otherwise.
pub(crate) fn hint_listing<'c>(
    diagnostic: crate::diagnostic::Diagnostic,
    lead: &str,
    candidates: impl IntoIterator<Item = &'c str>,
    budget: &Budget,
) -> crate::diagnostic::Diagnostic {
    match candidates_list_within(candidates, budget) {
        Some(list) if !list.is_empty() => diagnostic.hint(format!("{lead} {list}")),
        _ => diagnostic,
    }
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
        // One letter for another is no slip: nothing of the name is left.
        assert_eq!(did_you_mean("c", ["h", "a"]), None);
        // Regression: an empty name (an unnamed `parallel`) was a prefix
        // of every name, so "did you mean ``?".
        assert_eq!(did_you_mean("zzz", ["", "abc"]), None);
        assert_eq!(did_you_mean("tick", ["t", "ti"]), None);
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

    /// A call measures all its candidates or none; a budget that pays for
    /// listing them but not for measuring them suggests only a name cut
    /// short, and one that cannot list them suggests nothing.
    #[test]
    fn a_spent_budget_suggests_by_prefix_only() {
        let names = ["summary", "category"];
        // Listing costs 8 + 9 cells; measuring, 6 x 7 for `summary` and 6 x 8
        // for `category`.
        let listed = 8 + 9;
        let budget = Budget::new(listed + 6 * 7 + 6 * 8 - 1);
        assert_eq!(did_you_mean_within("sumary", names, &budget), None);
        let budget = Budget::new(listed + 6 * 7 + 6 * 8 + listed);
        assert_eq!(
            did_you_mean_within("sumary", names, &budget),
            Some("summary")
        );
        assert_eq!(budget.left(), listed);
        assert_eq!(
            did_you_mean_within("categ", names, &budget),
            Some("category")
        );
        assert_eq!(budget.left(), 0);
        assert_eq!(did_you_mean_within("categ", names, &budget), None);
        assert_eq!(candidates_list_within(names, &budget), None);
    }

    /// Regression: a spent budget walked every candidate of every later
    /// error (10,000 misspelt step ids among 20,000 steps: 9 s). Past what
    /// it can pay, the walk stops.
    #[test]
    fn a_spent_budget_stops_walking_candidates() {
        let budget = Budget::new(10);
        let walked = std::cell::Cell::new(0);
        let names = (0..1_000).map(|_| {
            walked.set(walked.get() + 1);
            "name"
        });
        assert_eq!(candidates_list_within(names, &budget), None);
        // Two names of 5 cells each are paid for; the third is past.
        assert_eq!(walked.get(), 3);
        assert_eq!(budget.left(), 0);
    }

    #[test]
    fn lists_are_sorted_and_bounded() {
        assert_eq!(candidates_list(["b", "a", "b"]), "`a`, `b`");
        let many: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        assert!(candidates_list(many.iter().map(String::as_str)).ends_with("and 8 more"));
    }
}
