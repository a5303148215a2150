//! Helpers shared by the end-to-end tests: start the real `proflow` binary on
//! free loopback ports with a config in a temporary directory, wait until it is
//! ready, talk HTTP to it, read what the file exporter wrote, and find the real
//! peer programs (Pyroscope clients, `go tool pprof`).
//!
//! Every spawned process is killed when its guard is dropped. Waits are bounded.
//! A missing peer fails the test; only `PROFLOW_SKIP_PEERS=1` outside CI turns
//! that into a skip, shown and recorded by [`peer_skip`].

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod names;
pub mod peer_skip;

#[allow(unused_imports)]
pub use names::now_nanos;
// Certificates made at test time (tests/tls_auth.rs, tests/otlp_receiver.rs).
#[allow(unused_imports)]
pub use proflow_net::test_pki as pki;

mod files;
mod metrics;
mod peers;
mod process;
mod profiles;

#[allow(unused_imports)]
pub use files::*;
#[allow(unused_imports)]
pub use metrics::*;
#[allow(unused_imports)]
pub use peers::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use profiles::*;
