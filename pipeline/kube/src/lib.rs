//! The Kubernetes API as proflow reads it.
//!
//! - [`connect`]: where the API server is and how to authenticate to it:
//!   in-cluster (the pod's ServiceAccount), a kubeconfig file, or an
//!   `api_server` URL with the component's own TLS and credentials; gives a
//!   [`Client`].
//! - [`objects`]: the subset of pods, services, endpoints, endpoint slices,
//!   nodes and namespaces proflow uses. Every other field of an object is
//!   skipped while it is parsed, so what a cache keeps of an object is its
//!   names, labels, annotations, addresses and ports.
//! - [`watch`]: a [`Store`] of one kind of object, kept current by a task
//!   that lists and then watches (resuming from the last version it saw,
//!   listing again when the server says that version is gone), with bounds
//!   on the bytes of one object, of one list page, and on the number of
//!   objects kept.
//!
//! Nothing here knows about targets or profiles: the scrape receiver's
//! `kubernetes_sd_configs` and the `k8s_attributes` processor build on it.

pub mod connect;
pub mod objects;
pub mod watch;

pub use connect::{Client, Connect};
pub use objects::Resource;
pub use watch::{Event, Scope, Store, WatchLimits, decode_event, decode_list};
