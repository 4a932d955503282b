//! Where a finished attach goes in the transport's table. Attaches towards one peer run
//! side by side (a recovery's, and a refresh's for a buffer allocated since), each mapping
//! the buffers of the descriptor it read when it started, and they end in any order. The
//! table must come out the same whichever ends last: the mappings of an older descriptor
//! never replace those of a newer one of the same incarnation, and an attach to an
//! incarnation that is gone by the time it ends puts nothing in.

/// What to do with the peer and mappings an attach made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    /// Put them in, in place of what the table holds for the peer (nothing, or another
    /// incarnation, or one known dead).
    Install,
    /// The table already holds this incarnation, alive: add the buffers it lacks, keep
    /// its peer (whose connection watches the target's life) and let go of the new one.
    Merge,
    /// Mapped for an incarnation the peer no longer is: let go of them.
    Stale,
}

/// `held`: the incarnation the table holds for the peer and whether it is known alive;
/// `attached`: the incarnation the attach mapped; `known`: the peer's incarnation now.
pub(super) fn placement(held: Option<(u64, bool)>, attached: u64, known: u64) -> Placement {
    match held {
        Some((engine, true)) if engine == attached => Placement::Merge,
        _ if attached != known => Placement::Stale,
        _ => Placement::Install,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_attach_of_the_held_incarnation_adds_to_it_whichever_ends_last() {
        assert_eq!(placement(Some((7, true)), 7, 7), Placement::Merge);
        // Even when the peer restarted meanwhile: the next attach replaces the entry.
        assert_eq!(placement(Some((7, true)), 7, 8), Placement::Merge);
    }

    #[test]
    fn the_known_incarnation_replaces_nothing_another_or_a_dead_one() {
        assert_eq!(placement(None, 8, 8), Placement::Install);
        assert_eq!(placement(Some((7, true)), 8, 8), Placement::Install);
        assert_eq!(placement(Some((8, false)), 8, 8), Placement::Install);
    }

    #[test]
    fn an_attach_to_a_gone_incarnation_puts_nothing_in() {
        assert_eq!(placement(None, 7, 8), Placement::Stale);
        assert_eq!(placement(Some((8, true)), 7, 8), Placement::Stale);
        assert_eq!(placement(Some((7, false)), 7, 8), Placement::Stale);
    }
}
