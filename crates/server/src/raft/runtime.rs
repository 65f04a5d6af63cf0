//! openraft's async runtime for Permit: tokio, as `openraft::TokioRuntime`, except for the
//! random numbers openraft draws (its election timeouts), which come from a generator a
//! simulation can seed ([`seed_election_rng`]) so that a seed replays the same elections. In
//! `permit serve` nothing seeds it, and the draws come from the thread's OS-seeded generator.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant, TokioRuntime};
use rand::{RngCore, SeedableRng};

thread_local! {
    /// The seeded generator of this thread, if a simulation seeded one.
    static SEEDED: RefCell<Option<rand::rngs::StdRng>> = const { RefCell::new(None) };
}

/// Makes openraft's random draws on this thread come from a generator seeded with `seed` (a
/// simulation runs all its nodes on one thread); `None` returns to the OS-seeded generator.
pub fn seed_election_rng(seed: Option<u64>) {
    SEEDED.with_borrow_mut(|slot| *slot = seed.map(rand::rngs::StdRng::seed_from_u64));
}

fn draw<R>(f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
    SEEDED.with_borrow_mut(|slot| match slot {
        Some(seeded) => f(seeded),
        None => f(&mut rand::rng()),
    })
}

/// openraft's random numbers: the seeded generator of this thread, else the OS-seeded one.
#[derive(Debug, Clone, Copy, Default)]
pub struct ElectionRng;

impl rand_core06::RngCore for ElectionRng {
    fn next_u32(&mut self) -> u32 {
        draw(|rng| rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        draw(|rng| rng.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        draw(|rng| rng.fill_bytes(dest));
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core06::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// tokio, with [`ElectionRng`]. Everything else is `openraft::TokioRuntime`'s.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PermitRuntime;

impl AsyncRuntime for PermitRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ElectionRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ElectionRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use rand_core06::RngCore as _;

    use super::*;

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_again() {
        seed_election_rng(Some(7));
        let first: Vec<u64> = (0..4).map(|_| ElectionRng.next_u64()).collect();
        seed_election_rng(Some(7));
        let second: Vec<u64> = (0..4).map(|_| ElectionRng.next_u64()).collect();
        seed_election_rng(None);
        let unseeded: Vec<u64> = (0..4).map(|_| ElectionRng.next_u64()).collect();
        assert_eq!(first, second);
        assert_ne!(first, unseeded);
    }
}
