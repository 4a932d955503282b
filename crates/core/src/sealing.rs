//! Whether a tcp connection is sealed (`seal`): the engine's `encrypt` setting, what
//! it asks of a peer at a given address, and the outcome both ends agree on in the
//! handshake. Pure decisions; the handshake (`auth`, `net`) carries them.
//!
//! The client's Hello says what it asks for ([`HELLO_SEAL_REQUIRED`]) and what it takes
//! ([`HELLO_SEAL_ACCEPTED`]); the server's challenge says the outcome
//! ([`CHALLENGE_SEALED`]). Both ride in the transcript that the handshake's MACs cover, so
//! a relay cannot strip them: a downgrade fails the handshake.

/// The engine's `encrypt` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encrypt {
    /// Seal tcp connections to and from peers beyond loopback; on loopback, seal when
    /// the other end requires it.
    #[default]
    Auto,
    /// Seal every tcp connection; refuse peers that will not.
    Always,
    /// Never seal; a peer that requires sealing refuses this engine.
    Never,
}

/// What an engine asks of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stance {
    /// Sealed, or no connection.
    Require,
    /// Sealed if the other end requires it.
    Accept,
    /// Plaintext, or no connection.
    Refuse,
}

impl Encrypt {
    /// The stance towards a peer, by whether its address is loopback. Without a secret
    /// nothing can be sealed (no keys): `Always` is refused when the engine is built.
    pub(crate) fn stance(self, peer_is_loopback: bool) -> Stance {
        match self {
            Self::Always => Stance::Require,
            Self::Never => Stance::Refuse,
            Self::Auto if peer_is_loopback => Stance::Accept,
            Self::Auto => Stance::Require,
        }
    }

    /// Parses `"auto" | "true" | "false"` (the binding's and tebench's spelling).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "true" | "on" => Some(Self::Always),
            "false" | "off" => Some(Self::Never),
            _ => None,
        }
    }
}

/// Hello flag: the client requires a sealed connection.
pub(crate) const HELLO_SEAL_REQUIRED: u16 = 2;
/// Hello flag: the client seals if the server requires it.
pub(crate) const HELLO_SEAL_ACCEPTED: u16 = 4;
/// Challenge flag: the connection is sealed from the frame after the HelloAck on.
pub(crate) const CHALLENGE_SEALED: u16 = 1;

/// The Hello flags of a client with `stance`.
pub(crate) fn hello_flags(stance: Stance) -> u16 {
    match stance {
        Stance::Require => HELLO_SEAL_REQUIRED | HELLO_SEAL_ACCEPTED,
        Stance::Accept => HELLO_SEAL_ACCEPTED,
        Stance::Refuse => 0,
    }
}

/// The server's verdict on a Hello with `flags`, by its own `stance`: sealed or not, or
/// `None` when the two cannot agree (the server requires sealing, the client refuses it).
/// A client that requires sealing gets it whatever the server's stance: sealing only adds.
pub(crate) fn server_verdict(hello_flags: u16, stance: Stance) -> Option<bool> {
    let required = hello_flags & HELLO_SEAL_REQUIRED != 0;
    let accepted = hello_flags & HELLO_SEAL_ACCEPTED != 0;
    match stance {
        _ if required => Some(true),
        Stance::Require if accepted => Some(true),
        Stance::Require => None,
        Stance::Accept | Stance::Refuse => Some(false),
    }
}

/// Whether a client with `stance` takes the server's outcome `sealed`.
pub(crate) fn client_accepts(stance: Stance, sealed: bool) -> bool {
    match stance {
        Stance::Require => sealed,
        Stance::Accept => true,
        Stance::Refuse => !sealed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_seals_beyond_loopback_and_follows_the_peer_on_loopback() {
        assert_eq!(Encrypt::default(), Encrypt::Auto);
        assert_eq!(Encrypt::Auto.stance(false), Stance::Require);
        assert_eq!(Encrypt::Auto.stance(true), Stance::Accept);
        assert_eq!(Encrypt::Always.stance(true), Stance::Require);
        assert_eq!(Encrypt::Never.stance(false), Stance::Refuse);
    }

    #[test]
    fn both_ends_agree_or_the_connection_is_refused() {
        use Stance::*;
        for client in [Require, Accept, Refuse] {
            for server in [Require, Accept, Refuse] {
                let verdict = server_verdict(hello_flags(client), server);
                let expected = match (client, server) {
                    (Require, _) | (Accept, Require) => Some(true),
                    (Refuse, Require) => None,
                    _ => Some(false),
                };
                assert_eq!(verdict, expected, "{client:?} → {server:?}");
                if let Some(sealed) = verdict {
                    assert!(client_accepts(client, sealed), "{client:?} → {server:?}");
                }
            }
        }
        // A relay that strips the seal from the outcome: the requiring client refuses
        // (and the MACs over the transcript fail first).
        assert!(!client_accepts(Require, false));
        assert!(!client_accepts(Refuse, true));
    }

    #[test]
    fn the_settings_parse_from_their_spelling() {
        assert_eq!(Encrypt::parse("auto"), Some(Encrypt::Auto));
        assert_eq!(Encrypt::parse("true"), Some(Encrypt::Always));
        assert_eq!(Encrypt::parse("false"), Some(Encrypt::Never));
        assert_eq!(Encrypt::parse("yes"), None);
    }
}
