//! What every call on one connection shares: the in-flight call budget and
//! the wrapper that runs a call body under it. Its own module so the
//! capability servers (`server_sync`, `server_shell`) and the accept loop
//! (`server`) all depend on it without depending on each other.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;

use super::WireError;
use super::convert::error_to;

/// Per-connection state: the in-flight call budget.
pub(crate) struct Conn {
    in_flight: Cell<usize>,
    max_in_flight: usize,
}

/// Holds one unit of the connection's in-flight budget while a call runs.
pub(crate) struct CallGuard(Rc<Conn>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.in_flight.set(self.0.in_flight.get() - 1);
    }
}

impl Conn {
    pub(crate) fn new(max_in_flight: usize) -> Conn {
        Conn {
            in_flight: Cell::new(0),
            max_in_flight,
        }
    }

    pub(crate) fn enter(self: &Rc<Self>) -> Result<CallGuard, WireError> {
        let n = self.in_flight.get();
        WireError::check_limit("in-flight calls per connection", self.max_in_flight, n + 1)?;
        self.in_flight.set(n + 1);
        Ok(CallGuard(self.clone()))
    }
}

/// Runs one call body under the connection's in-flight budget and encodes
/// its error as a coded exception.
pub(crate) async fn run_call<F>(
    conn: &Rc<Conn>,
    method: &'static str,
    body: F,
) -> Result<(), capnp::Error>
where
    F: Future<Output = Result<(), WireError>>,
{
    let result = match conn.enter() {
        Ok(_guard) => body.await,
        Err(e) => Err(e),
    };
    result.map_err(|e| {
        tracing::debug!(method, error = %e, "call failed");
        error_to(&e)
    })
}
