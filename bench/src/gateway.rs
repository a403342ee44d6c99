//! What the benches that drive a kernel over its WebSocket share: a
//! logged-in client and the latency summary they print.

use std::time::Duration;

use gsv_kernel::client::{Credentials, GsvClient};

/// The `p`-quantile (0.0–1.0) of `v`, which it sorts.
pub fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Prints `name: p50 … p99 … (n=…)`.
pub fn report(name: &str, mut v: Vec<Duration>) {
    let (p50, p99) = (percentile(&mut v, 0.5), percentile(&mut v, 0.99));
    println!("{name}: p50 {p50:?}  p99 {p99:?}  (n={})", v.len());
}

/// A client of the kernel at `url`, logged in as `user` with password
/// `pw`, whose calls wait up to a minute (a loaded machine).
pub async fn login(url: &str, user: &str, pw: &str) -> GsvClient {
    let mut c = GsvClient::connect(url)
        .await
        .expect("connect to the kernel");
    c.timeout = Duration::from_secs(60);
    c.login(user, &Credentials::Password(pw.into()))
        .await
        .expect("log in");
    c
}
