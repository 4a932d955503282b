//! Whether a peer pool's data connections are sealed. The handshake decides it from both
//! ends' stances (`sealing`): this engine's stance alone settles it when it requires
//! sealing (sealed, or no connection) or refuses it (plaintext, or no connection); a
//! stance that accepts either (`encrypt: 'auto'` towards a loopback address) seals
//! exactly when the peer requires it, which only a connection's handshake tells. Pure.

use crate::sealing::Stance;

/// What this engine's stance alone says of its data connections to a peer: sealed,
/// plaintext, or `None` (the peer decides).
pub(super) fn by_stance(stance: Stance) -> Option<bool> {
    match stance {
        Stance::Require => Some(true),
        Stance::Refuse => Some(false),
        Stance::Accept => None,
    }
}

/// Whether the pool's data connections are sealed: what the stance says, else what the
/// handshake of a connection open now said (`open`), else not known yet (`None`).
pub(super) fn sealed(by_stance: Option<bool>, open: impl FnOnce() -> Option<bool>) -> Option<bool> {
    by_stance.or_else(open)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sealing::{client_accepts, hello_flags, server_verdict, Encrypt};

    /// What a handshake between a client and a server with these stances agrees on:
    /// sealed or not, or `None` (refused: no connection).
    fn negotiated(client: Stance, server: Stance) -> Option<bool> {
        server_verdict(hello_flags(client), server).filter(|&sealed| client_accepts(client, sealed))
    }

    /// Every pair of settings ('auto', true, false on each side, both directions: the
    /// initiator is either engine), on loopback and beyond it: what the pool says is what
    /// the handshake agreed on, before any connection when the stance settles it, and
    /// once a connection is open otherwise.
    #[test]
    fn the_pool_says_what_the_handshake_agreed_on_across_the_matrix() {
        let settings = [Encrypt::Auto, Encrypt::Always, Encrypt::Never];
        for initiator in settings {
            for target in settings {
                for loopback in [true, false] {
                    let (client, server) = (initiator.stance(loopback), target.stance(loopback));
                    let agreed = negotiated(client, server);
                    let cell = format!("{initiator:?} → {target:?}, loopback {loopback}");
                    let before = sealed(by_stance(client), || None);
                    if let (Some(before), Some(agreed)) = (before, agreed) {
                        assert_eq!(before, agreed, "before any connection: {cell}");
                    }
                    if agreed.is_some() {
                        assert_eq!(sealed(by_stance(client), || agreed), agreed, "{cell}");
                    }
                }
            }
        }
    }

    /// The cells where only the peer knows: an 'auto' initiator on loopback, sealed
    /// towards a target that requires it (true), plaintext towards the others.
    #[test]
    fn an_auto_initiator_on_loopback_learns_it_from_the_handshake() {
        let client = Encrypt::Auto.stance(true);
        assert_eq!(by_stance(client), None);
        assert_eq!(negotiated(client, Encrypt::Always.stance(true)), Some(true));
        for target in [Encrypt::Auto, Encrypt::Never] {
            assert_eq!(negotiated(client, target.stance(true)), Some(false));
        }
        assert_eq!(
            sealed(by_stance(client), || None),
            None,
            "no connection yet"
        );
    }
}
