//! Bounded concurrency within one task: loop iterations at `concurrency N`,
//! parallel branches, preflight checks.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::services::BoxFuture;

/// Runs futures with at most `limit` in flight, in their order, and returns
/// the results in that order once all that started have settled; after a
/// result for which `stop` holds, no further future starts.
pub(crate) async fn run_bounded<'a, T: Send + 'a>(
    futures: impl Iterator<Item = BoxFuture<'a, T>>,
    limit: usize,
    stop: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut results: Vec<Option<T>> = Vec::new();
    let mut waiting = futures.enumerate();
    let mut running: Vec<(usize, BoxFuture<'a, T>)> = Vec::new();
    let mut stopped = false;
    loop {
        // Futures are created only when they start, so a long loop does not
        // hold every iteration at once.
        while !stopped && running.len() < limit {
            match waiting.next() {
                Some(next) => {
                    results.push(None);
                    running.push(next);
                }
                None => break,
            }
        }
        if running.is_empty() {
            break;
        }
        let (index, result) = FirstReady(&mut running).await;
        stopped |= stop(&result);
        results[index] = Some(result);
    }
    results.into_iter().flatten().collect()
}

/// Resolves with the first of the running futures that completes, removing it.
struct FirstReady<'r, 'a, T>(&'r mut Vec<(usize, BoxFuture<'a, T>)>);

impl<T> Future for FirstReady<'_, '_, T> {
    type Output = (usize, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(usize, T)> {
        let running = &mut *self.0;
        for position in 0..running.len() {
            if let Poll::Ready(result) = running[position].1.as_mut().poll(cx) {
                let (index, _) = running.remove(position);
                return Poll::Ready((index, result));
            }
        }
        Poll::Pending
    }
}
