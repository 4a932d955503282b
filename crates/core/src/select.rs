//! Ranking the transports that may serve a request. Pure code.

use crate::error::{Error, Result};
use crate::transport::TransportKind;

/// Default preference: same-host shared memory, then RDMA, then TCP.
pub const DEFAULT_ORDER: [TransportKind; 3] =
    [TransportKind::Shm, TransportKind::Rdma, TransportKind::Tcp];

/// Candidates for a request, best first: the transports the target registered the buffer
/// with, kept if enabled here, in default order, with the hint (if any) pinned first.
pub fn rank(
    registered: &[TransportKind],
    enabled: &[TransportKind],
    hint: Option<TransportKind>,
) -> Result<Vec<TransportKind>> {
    let mut out: Vec<TransportKind> = DEFAULT_ORDER
        .iter()
        .copied()
        .filter(|k| registered.contains(k) && enabled.contains(k))
        .collect();
    if let Some(h) = hint {
        match out.iter().position(|k| *k == h) {
            Some(i) => {
                let k = out.remove(i);
                out.insert(0, k);
            }
            None => {
                return Err(Error::TransportUnavailable(format!(
                    "{} is not both enabled here and registered by the target",
                    h.name()
                )))
            }
        }
    }
    if out.is_empty() {
        return Err(Error::TransportUnavailable(format!(
            "target registered {registered:?}, this engine enables {enabled:?}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransportKind::*;

    #[test]
    fn default_order_and_filters() {
        assert_eq!(
            rank(&[Tcp, Shm], &[Tcp, Shm, Rdma], None).expect("ok"),
            [Shm, Tcp]
        );
        assert_eq!(rank(&[Tcp, Shm], &[Tcp], None).expect("ok"), [Tcp]);
        assert_eq!(
            rank(&[Tcp, Shm, Rdma], &[Tcp, Rdma, Shm], Some(Tcp)).expect("ok"),
            [Tcp, Shm, Rdma]
        );
        assert!(rank(&[Shm], &[Tcp], None).is_err());
        assert_eq!(
            rank(&[Tcp], &[Tcp], Some(Rdma)).unwrap_err().code(),
            "ERR_FERRY_TRANSPORT_UNAVAILABLE"
        );
    }
}
