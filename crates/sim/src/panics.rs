//! Panics of the simulation's own thread. Every node runs on the simulation's current-thread
//! runtime, so a panic in any node task (an invariant assertion in `apply`, say) lands here, even
//! though tokio catches it and the node only reports a fatal error.

use std::cell::RefCell;
use std::sync::Once;

thread_local! {
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Makes panics on every thread also land in that thread's list (once per process); the
/// previous hook still runs, so messages are printed as usual.
pub fn install_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.to_string();
            // `try_with`: a panic while the thread-local is torn down is only printed.
            let _ = PANICS.try_with(|panics| panics.borrow_mut().push(message));
            previous(info);
        }));
    });
}

/// Takes the panics recorded on this thread so far.
pub fn take() -> Vec<String> {
    PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut()))
}
