//! What proflow's network edges share: the accept loop every listener runs
//! ([`server`]: connection limits and eviction, timeouts, TLS, auth, request
//! bodies read under the memory budget as they arrive), the rustls client
//! setup of components that connect out ([`tls`]), (feature `http-client`)
//! their GET client ([`http`]), query escaping for the URLs they build
//! ([`url`]), and (feature `test-pki`) certificates made at test time.
//!
//! It depends on `proflow-config` and `proflow-model` only.

mod error_chain;
pub use error_chain::error_chain;

#[cfg(feature = "http-client")]
pub mod http;
pub mod server;
#[cfg(feature = "test-pki")]
pub mod test_pki;
pub mod tls;
pub mod url;

// The memory budget, named `crate::memory` by the network code.
