//! Work spread over a pool of scoped threads, one per available core.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `work` applied to every item on a pool of scoped threads, the results in
/// the order of `items`.
///
/// Items are handed out one at a time from a shared counter rather than in
/// fixed chunks, so that one large item does not leave the other workers
/// idle. A panic in `work` is a bug of flowc's and is raised again here.
pub(crate) fn map<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                // A test runs its workflow here, as deep as a plan nests.
                std::thread::Builder::new()
                    .stack_size(flow_plan::limits::STACK_BYTES)
                    .spawn_scoped(scope, || {
                        let mut mine = Vec::new();
                        loop {
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            let Some(item) = items.get(index) else { break };
                            mine.push((index, work(item)));
                        }
                        mine
                    })
                    .expect("a thread of flowc's pool starts")
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, result)| result).collect()
}
