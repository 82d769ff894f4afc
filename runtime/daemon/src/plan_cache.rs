//! The plans flowd has parsed, kept by hash within a budget of bytes.
//!
//! Every run start needs its plan, and parsing one costs far more than the
//! start itself, so parsed plans are kept. A hash names one plan for ever,
//! so a kept plan is never stale; but tenants deploy as many plans as their
//! quota allows, some large, and a cache that kept them all grew without
//! bound (ten large plans held 600 MB). The least recently used plans go
//! once the plans kept weigh more than the budget, measured as the size of
//! their JSON.

use std::collections::HashMap;
use std::sync::Arc;

use flow_plan::Plan;

#[derive(Debug)]
pub(crate) struct PlanCache {
    budget: usize,
    state: std::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    plans: HashMap<String, Kept>,
    /// The bytes of the plans kept.
    weight: usize,
    /// Counts uses, for recency.
    clock: u64,
}

#[derive(Debug)]
struct Kept {
    plan: Arc<Plan>,
    weight: usize,
    used: u64,
}

impl PlanCache {
    /// A cache of at most `budget` bytes of plans (one larger plan is kept
    /// alone).
    pub(crate) fn new(budget: usize) -> PlanCache {
        PlanCache {
            budget,
            state: std::sync::Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, hash: &str) -> Option<Arc<Plan>> {
        let mut state = self.lock();
        state.clock += 1;
        let now = state.clock;
        let kept = state.plans.get_mut(hash)?;
        kept.used = now;
        Some(Arc::clone(&kept.plan))
    }

    pub(crate) fn insert(&self, hash: &str, plan: Arc<Plan>) {
        let weight = json_size(&plan);
        let mut state = self.lock();
        state.clock += 1;
        let used = state.clock;
        if let Some(old) = state
            .plans
            .insert(hash.to_string(), Kept { plan, weight, used })
        {
            state.weight -= old.weight;
        }
        state.weight += weight;
        // Linear in the plans kept, which the budget keeps few; only when
        // over it.
        while state.weight > self.budget && state.plans.len() > 1 {
            let Some(oldest) = state
                .plans
                .iter()
                .filter(|(key, _)| key.as_str() != hash)
                .min_by_key(|(_, kept)| kept.used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(gone) = state.plans.remove(&oldest) {
                state.weight -= gone.weight;
            }
        }
    }

    /// The bytes of the plans kept now.
    #[cfg(test)]
    fn weight(&self) -> usize {
        self.lock().weight
    }
}

/// The size of `plan` as JSON, counted without writing it out.
fn json_size(plan: &Plan) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, plan);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str) -> Arc<Plan> {
        let mut plan: Plan = serde_json::from_value(serde_json::json!({
            "format_version": 1, "hash": "", "source": "t.flow", "recipes": [], "workflows": [], "mcp_servers": []
        }))
        .unwrap();
        plan.hash = name.repeat(100);
        Arc::new(plan)
    }

    #[test]
    fn the_least_recently_used_plans_go_past_the_budget() {
        let one = json_size(&plan("a"));
        let cache = PlanCache::new(one * 2);
        cache.insert("a", plan("a"));
        cache.insert("b", plan("b"));
        assert!(cache.get("a").is_some(), "a is now the most recently used");
        cache.insert("c", plan("c"));
        assert!(cache.get("b").is_none(), "b went");
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        assert!(cache.weight() <= one * 2);
        // A plan heavier than the whole budget is kept alone.
        let tiny = PlanCache::new(1);
        tiny.insert("a", plan("a"));
        tiny.insert("b", plan("b"));
        assert!(tiny.get("a").is_none() && tiny.get("b").is_some());
    }
}
