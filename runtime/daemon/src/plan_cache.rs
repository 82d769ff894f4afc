//! The plans flowd has parsed, kept by hash within a budget of bytes.
//!
//! Every run start needs its plan, and parsing one costs far more than the
//! start itself, so parsed plans are kept. A hash names one plan for ever,
//! so a kept plan is never stale; but tenants deploy as many plans as their
//! quota allows, some large, and a cache that kept them all grew without
//! bound (ten large plans held 600 MB). The least recently used plans go
//! once the plans kept weigh more than the budget, measured as the size of
//! their JSON.
//!
//! A plan not kept is loaded (read, parsed, validated) once however many
//! starts want it at once, and a few plans at most are loaded at once
//! ([`PlanCache::get_or_load`]): a plan of tens of megabytes takes a core
//! for a second and a few times its size in memory while it is read, and a
//! thousand starts of one such plan at once, or a tenant's large plans
//! started in turn, would otherwise take every core and gigabytes. One
//! account holds all those places but one: its large plans loaded in turn
//! leave a place for another account's first start.

use std::collections::HashMap;
use std::sync::Arc;

use flow_plan::Plan;

#[derive(Debug)]
pub(crate) struct PlanCache {
    budget: usize,
    state: std::sync::Mutex<State>,
    /// Places for plans being loaded at once.
    loads: tokio::sync::Semaphore,
    /// How many of `loads` one account holds at most: all but one.
    places_of_one_account: usize,
    /// The places each account loading plans has left, by account; an
    /// account goes once it loads nothing.
    accounts: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// A turn to load each plan being loaded, by hash: a start that misses
    /// waits for the load under way rather than load the plan again. A
    /// hash goes once no start holds or waits for its turn.
    loading: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// When dropped, forgets the entry under `.1` of the map `.0` if nothing
/// else holds it: those who want an entry clone it under the map's lock.
/// A guard, so that a start dropped mid-load (its request gone) leaves
/// nothing behind.
struct ForgetIfIdle<'a, T>(&'a std::sync::Mutex<HashMap<String, Arc<T>>>, &'a str);

impl<T> Drop for ForgetIfIdle<'_, T> {
    fn drop(&mut self) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(self.1)
            .is_some_and(|entry| Arc::strong_count(entry) == 1)
        {
            map.remove(self.1);
        }
    }
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
    /// alone), loading at most `loads` at once.
    pub(crate) fn new(budget: usize, loads: usize) -> PlanCache {
        PlanCache {
            budget,
            state: std::sync::Mutex::new(State::default()),
            loads: tokio::sync::Semaphore::new(loads.max(1)),
            places_of_one_account: loads.saturating_sub(1).max(1),
            accounts: std::sync::Mutex::default(),
            loading: std::sync::Mutex::default(),
        }
    }

    /// The plan kept under `hash`, or the one `load` gives (the plan and
    /// its [`weight`]), kept; a load is `account`'s, within its places. One
    /// load of a hash at a time: those who wait for it find the plan kept
    /// when their turn comes (or load it, if the load failed). Two
    /// accounts that deployed the same plan (one hash) share its turn: the
    /// second may wait for the first's places, which is rare and ends with
    /// the plan kept for both.
    pub(crate) async fn get_or_load<E>(
        &self,
        account: &str,
        hash: &str,
        load: impl Future<Output = Result<(Arc<Plan>, usize), E>>,
    ) -> Result<Arc<Plan>, E> {
        if let Some(plan) = self.get(hash) {
            return Ok(plan);
        }
        // Declared first, so dropped last, once the turn is let go.
        let _forget_turn = ForgetIfIdle(&self.loading, hash);
        let gate = Arc::clone(
            self.loading
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(hash.to_string())
                .or_default(),
        );
        let _turn = gate.lock_owned().await;
        match self.get(hash) {
            Some(plan) => Ok(plan),
            None => {
                // Declared first, so dropped last, once the places are let
                // go.
                let _forget_places = ForgetIfIdle(&self.accounts, account);
                // The account's place first: one waiting for its own holds
                // none of the places the others would take.
                let own = self.places_of(account).acquire_owned().await;
                let place = self.loads.acquire().await;
                let (Ok(_own), Ok(_place)) = (own, place) else {
                    unreachable!("the semaphores of plan loads are never closed");
                };
                load.await.map(|(plan, weight)| {
                    self.insert(hash, Arc::clone(&plan), weight);
                    plan
                })
            }
        }
    }

    /// The places `account` has left for loads.
    fn places_of(&self, account: &str) -> Arc<tokio::sync::Semaphore> {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let places = accounts
            .entry(account.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.places_of_one_account)));
        Arc::clone(places)
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

    /// Keeps `plan`, whose [`weight`] is `weight`. The plans it pushes out
    /// are freed off the async worker, if nothing else holds them.
    pub(crate) fn insert(&self, hash: &str, plan: Arc<Plan>, weight: usize) {
        // Let go of once the lock is.
        let gone = self.keep(hash, plan, weight);
        gone.into_iter().for_each(crate::freed_off_worker::release);
    }

    /// Keeps `plan`; answers the plans it replaced or pushed out.
    fn keep(&self, hash: &str, plan: Arc<Plan>, weight: usize) -> Vec<Arc<Plan>> {
        let mut gone = Vec::new();
        let mut state = self.lock();
        state.clock += 1;
        let used = state.clock;
        if let Some(old) = state
            .plans
            .insert(hash.to_string(), Kept { plan, weight, used })
        {
            state.weight -= old.weight;
            gone.push(old.plan);
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
            if let Some(out) = state.plans.remove(&oldest) {
                state.weight -= out.weight;
                gone.push(out.plan);
            }
        }
        gone
    }

    /// The bytes of the plans kept now.
    #[cfg(test)]
    fn weight_kept(&self) -> usize {
        self.lock().weight
    }
}

/// What `plan` weighs in the cache: its size as JSON, counted without
/// writing it out (a pass over the plan: done where it is loaded, off the
/// async workers).
pub(crate) fn weight(plan: &Plan) -> usize {
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

    /// Regression: each start that missed a plan read and parsed it, on the
    /// async worker: a large plan's starts after a restart stalled every
    /// run of the process for a second each.
    #[tokio::test]
    async fn starts_that_miss_one_plan_at_once_load_it_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = Arc::new(PlanCache::new(1 << 20, 2));
        let loads = Arc::new(AtomicUsize::new(0));
        let load = |loads: Arc<AtomicUsize>| async move {
            loads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Ok::<_, ()>((plan("a"), 1))
        };
        let mut starts = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let (cache, loads) = (Arc::clone(&cache), Arc::clone(&loads));
            starts.spawn(async move { cache.get_or_load("acme", "a", load(loads)).await });
        }
        while let Some(started) = starts.join_next().await {
            assert!(started.unwrap().is_ok());
        }
        assert_eq!(
            loads.load(Ordering::SeqCst),
            1,
            "one load for twenty starts"
        );
        // A failed load is not kept: the next start loads again.
        let failed = cache.get_or_load("acme", "b", async { Err::<(Arc<Plan>, usize), _>(()) });
        assert!(failed.await.is_err());
        assert!(
            cache
                .get_or_load("acme", "b", load(Arc::clone(&loads)))
                .await
                .is_ok()
        );
        assert_eq!(loads.load(Ordering::SeqCst), 2);
        assert!(
            cache.loading.lock().unwrap().is_empty(),
            "no turn is left behind"
        );
        assert!(
            cache.accounts.lock().unwrap().is_empty(),
            "no account's places are left behind"
        );
    }

    /// Regression: the places for loads were anyone's, so one account
    /// starting its large plans in turn (each a second or more to load)
    /// took them all, and another account's first start of a plan waited
    /// behind every one of them.
    #[tokio::test]
    async fn one_accounts_loads_leave_a_place_for_another_accounts() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = Arc::new(PlanCache::new(1 << 20, 2));
        // Acme's loads hang until told.
        let (go, gone) = tokio::sync::watch::channel(false);
        let started = Arc::new(AtomicUsize::new(0));
        let mut acme = tokio::task::JoinSet::new();
        for hash in ["a1", "a2", "a3"] {
            let (cache, mut gone) = (Arc::clone(&cache), gone.clone());
            let started = Arc::clone(&started);
            acme.spawn(async move {
                let load = async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = gone.wait_for(|go| *go).await;
                    Ok::<_, ()>((plan(hash), 1))
                };
                cache.get_or_load("acme", hash, load).await
            });
        }
        // Acme's loads under way, and the rest waiting for places.
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let globex = cache.get_or_load("globex", "g", async { Ok::<_, ()>((plan("g"), 1)) });
        let loaded = tokio::time::timeout(std::time::Duration::from_secs(5), globex).await;
        assert!(
            matches!(loaded, Ok(Ok(_))),
            "globex's load waited behind acme's"
        );
        go.send(true).unwrap();
        while let Some(loaded) = acme.join_next().await {
            assert!(loaded.unwrap().is_ok());
        }
        assert!(cache.accounts.lock().unwrap().is_empty());
        // A start dropped mid-load (its client gone) leaves nothing behind.
        let hanging = {
            let cache = Arc::clone(&cache);
            tokio::spawn(async move {
                let load = std::future::pending::<Result<(Arc<Plan>, usize), ()>>();
                cache.get_or_load("acme", "h", load).await
            })
        };
        while cache.accounts.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        hanging.abort();
        assert!(hanging.await.unwrap_err().is_cancelled());
        assert!(cache.accounts.lock().unwrap().is_empty());
        assert!(
            cache.loading.lock().unwrap().is_empty(),
            "the dropped start's turn stayed"
        );
        assert_eq!(cache.loads.available_permits(), 2);
    }

    #[test]
    fn the_least_recently_used_plans_go_past_the_budget() {
        let one = weight(&plan("a"));
        let cache = PlanCache::new(one * 2, 1);
        cache.insert("a", plan("a"), one);
        cache.insert("b", plan("b"), one);
        assert!(cache.get("a").is_some(), "a is now the most recently used");
        cache.insert("c", plan("c"), one);
        assert!(cache.get("b").is_none(), "b went");
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        assert!(cache.weight_kept() <= one * 2);
        // A plan heavier than the whole budget is kept alone.
        let tiny = PlanCache::new(1, 1);
        tiny.insert("a", plan("a"), one);
        tiny.insert("b", plan("b"), one);
        assert!(tiny.get("a").is_none() && tiny.get("b").is_some());
    }
}
