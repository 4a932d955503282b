//! What the cluster secret adds to `openSegment`: opens and closes a segment of a loopback
//! target many times, without and with a secret, interleaved, and prints the medians.
//!
//! `cargo run --release -p ferry-core --example handshake_cost [ROUNDS]`

use std::time::Instant;

use ferry_core::auth::Secret;
use ferry_core::{Engine, EngineConfig, TransportKind};

fn pair(secret: Option<&[u8]>) -> (Engine, Engine) {
    let cfg = EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        auth_secret: secret.map(|s| Secret::new(s.to_vec()).expect("secret")),
        // Without a secret, none at all (not the per-user one).
        allow_unauthenticated: secret.is_none(),
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let _buf = target.allocate(1 << 20).expect("buffer");
    (target, Engine::new(cfg).expect("initiator"))
}

fn open_close_us(target: &Engine, initiator: &Engine) -> f64 {
    let t0 = Instant::now();
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let us = t0.elapsed().as_secs_f64() * 1e6;
    initiator.close_segment(seg.handle).expect("close");
    us
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let plain = pair(None);
    let authed = pair(Some(&[7u8; 32]));
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        open_close_us(&plain.0, &plain.1);
        open_close_us(&authed.0, &authed.1);
    }
    for _ in 0..rounds {
        off.push(open_close_us(&plain.0, &plain.1));
        on.push(open_close_us(&authed.0, &authed.1));
    }
    let (off, on) = (median(off), median(on));
    println!(
        "openSegment median over {rounds} rounds: {off:.0} µs without a secret, {on:.0} µs with \
         one; added {:.0} µs",
        on - off
    );
    for (t, i) in [plain, authed] {
        i.close();
        t.close();
    }
}
