//! Running clean-up from `Drop`: on a thread of its own with a runtime of
//! its own, bounded in time.

use std::future::Future;
use std::time::Duration;

/// How long one guard's clean-up may take before it is abandoned (a test
/// must end even when a server stopped answering).
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// Runs `work` to completion (or for at most [`LIMIT`]) on a new thread
/// with a current-thread runtime, and waits for it.
///
/// `Drop` may run inside the test's runtime (where blocking on a future
/// would panic, and on a current-thread runtime nothing else could run),
/// outside any runtime (a synchronous test, a guard kept in a static), or
/// while the test unwinds from a panic or its runtime shuts down. A thread
/// with a runtime of its own works in all of these. Returns whether `work`
/// finished in time.
pub(crate) fn run<F>(what: &str, work: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    let what = what.to_owned();
    let worker = std::thread::Builder::new()
        .name(format!("teardown {what}"))
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return false;
            };
            let done = runtime.block_on(async { tokio::time::timeout(LIMIT, work).await.is_ok() });
            // Not waiting for blocking tasks (a hung host-name lookup).
            runtime.shutdown_background();
            done
        });
    let finished = worker.is_ok_and(|worker| worker.join().unwrap_or(false));
    if !finished {
        warn(&format!(
            "clean-up of {what} did not finish within {LIMIT:?}"
        ));
    }
    finished
}

/// Tells the test's output that something was left behind (shown with the
/// output of a failing test, or with `--nocapture`).
pub(crate) fn warn(message: &str) {
    // The kit's only channel to the person running the tests: a library
    // would use `tracing`, but tests rarely install a subscriber.
    #[allow(clippy::print_stderr)]
    {
        eprintln!("outbox-testkit: {message}");
    }
}
