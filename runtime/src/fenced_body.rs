//! A provider request's body that goes out only while its run is still this
//! invocation's.
//!
//! `Journal::admit` checks the hold before an attempt, but between that check
//! and the moment the request is written to the socket lie the request's
//! encoding, the HTTP client's pool and its connection task: milliseconds on
//! a loaded machine, and hundreds of runs may be in that gap at once. A
//! process stopped there past its lease (SIGSTOP, a VM pause) would, once
//! continued, send a step that another process has run meanwhile (found by
//! the chaos test, seed 1796225237056460129). So the body asks the hold once
//! more when the connection polls it, right before writing it: a body that
//! refuses ends the request unsent, and a server never acts on a request
//! whose body did not arrive in full (the `Content-Length` says how much is
//! due).
//!
//! What remains is the gap between that poll and the socket write, inside
//! one poll of one task: no await, no lock, no pool.
//!
//! A refusal is told apart from a transport failure by its error
//! (`HoldLost`): `openai::send_for_json` then asks the journal again, which
//! renews a hold that merely ran out (a stall, the run still this
//! process's) before the request goes anew.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::journal::Hold;

/// A body of one frame, given out only while `hold` is live.
pub struct FencedBody {
    bytes: Option<Bytes>,
    len: u64,
    hold: Arc<Hold>,
}

impl FencedBody {
    pub fn new(bytes: Vec<u8>, hold: Arc<Hold>) -> FencedBody {
        FencedBody {
            len: bytes.len() as u64,
            bytes: Some(Bytes::from(bytes)),
            hold,
        }
    }
}

/// The body's refusal: the run's hold was lost or ran out before it went out.
#[derive(Debug)]
pub struct HoldLost;

impl std::fmt::Display for HoldLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the run is no longer this process's; the request was not sent")
    }
}

impl std::error::Error for HoldLost {}

impl Body for FencedBody {
    type Data = Bytes;
    type Error = HoldLost;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HoldLost>>> {
        let Some(bytes) = self.bytes.take() else {
            return Poll::Ready(None);
        };
        if self.hold.live() {
            Poll::Ready(Some(Ok(Frame::data(bytes))))
        } else {
            Poll::Ready(Some(Err(HoldLost)))
        }
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    /// Exact, so that the request carries a `Content-Length` and a server
    /// can tell a body cut short from a whole one.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use http_body::Body;

    use super::*;

    fn first_frame(body: FencedBody) -> Option<Result<Frame<Bytes>, HoldLost>> {
        let waker = std::task::Waker::noop();
        let mut context = Context::from_waker(waker);
        let mut body = std::pin::pin!(body);
        match body.as_mut().poll_frame(&mut context) {
            Poll::Ready(frame) => frame,
            Poll::Pending => panic!("a body in memory is always ready"),
        }
    }

    #[test]
    fn a_live_hold_gives_the_body_whole() {
        let hold = Arc::new(Hold::new(
            true,
            Some(Instant::now() + Duration::from_secs(9)),
        ));
        let body = FencedBody::new(b"{}".to_vec(), hold);
        assert_eq!(body.size_hint().exact(), Some(2));
        let frame = first_frame(body).expect("a frame").expect("given out");
        assert_eq!(frame.into_data().expect("data"), Bytes::from_static(b"{}"));
    }

    /// Regression guard for the chaos test's call sent after its step
    /// completed elsewhere: a hold that ran out while the process was
    /// stopped refuses the body, though nothing asked the store yet.
    #[test]
    fn a_hold_that_ran_out_refuses_the_body() {
        let hold = Arc::new(Hold::new(true, Some(Instant::now())));
        assert!(first_frame(FencedBody::new(b"{}".to_vec(), hold)).is_some_and(|f| f.is_err()));
    }

    #[test]
    fn a_lost_hold_refuses_the_body() {
        let hold = Arc::new(Hold::new(true, None));
        hold.lose();
        assert!(first_frame(FencedBody::new(b"{}".to_vec(), hold)).is_some_and(|f| f.is_err()));
    }
}
