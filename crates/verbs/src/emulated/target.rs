//! What the device's responder needs of a target QP. The device keeps its QPs behind this
//! trait, so it does not depend on the QP module (which depends on the device for its
//! registry and responder addresses): the dependency runs one way, qp → device → target.

use crate::provider::{Gid, QpState};

/// A QP's connection state as the responder checks it for each incoming request.
pub(crate) struct PeerView {
    pub(crate) state: QpState,
    pub(crate) dest_qpn: u32,
    pub(crate) dgid: Option<Gid>,
    pub(crate) access_flags: u32,
}

/// A QP that incoming requests may target.
pub(crate) trait TargetQp: Send + Sync {
    /// The protection domain whose MRs the requests may reach.
    fn pd(&self) -> u64;
    /// Its state now.
    fn peer_view(&self) -> PeerView;
}
