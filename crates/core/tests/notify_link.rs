//! Notifications carried by the peer's link (its control connection) keep their binding to
//! the incarnation that took the data: when the link moves to a new incarnation of the
//! peer, a notification planned for the old one ends refused, and the new one gets nothing.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ferry_core::{Engine, EngineConfig, NotifyOutcome, Opcode, TransferStatus, TransportKind};
use ferry_testkit::{fill, request, within};

const LIMIT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

/// A tcp proxy for control connections: new ones go to `to`; once `held`, what the sender
/// writes on those made before is swallowed (a target that stopped reading, or died with
/// the frames in its socket) and kept in `swallowed`.
struct LinkProxy {
    addr: String,
    to: Arc<Mutex<String>>,
    held: Arc<AtomicBool>,
    swallowed: Arc<Mutex<Vec<u8>>>,
}

impl LinkProxy {
    fn start(backend: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let to = Arc::new(Mutex::new(backend.to_string()));
        let held = Arc::new(AtomicBool::new(false));
        let swallowed: Arc<Mutex<Vec<u8>>> = Arc::default();
        let (dest, hold, kept) = (to.clone(), held.clone(), swallowed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let dest = dest.lock().expect("to").clone();
                let Ok(server) = TcpStream::connect(&dest) else {
                    continue;
                };
                let (mut from, mut into) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                // Connections made once held are never held.
                let hold = (!hold.load(Ordering::SeqCst)).then(|| hold.clone());
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64 * 1024];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        if hold.as_ref().is_some_and(|h| h.load(Ordering::SeqCst)) {
                            kept.lock().expect("kept").extend_from_slice(&buf[..n]);
                        } else if into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = into.shutdown(Shutdown::Both);
                    let _ = from.shutdown(Shutdown::Both);
                });
                let (mut back, mut out) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut back, &mut out);
                    let _ = out.shutdown(Shutdown::Both);
                    let _ = back.shutdown(Shutdown::Both);
                });
            }
        });
        Self {
            addr,
            to,
            held,
            swallowed,
        }
    }

    /// Waits (at most `WAIT`) until the held connections swallowed `bytes`.
    fn swallowed(&self, bytes: &[u8]) -> bool {
        let deadline = std::time::Instant::now() + WAIT;
        while std::time::Instant::now() < deadline {
            let kept = self.swallowed.lock().expect("kept");
            if kept.windows(bytes.len()).any(|w| w == bytes) {
                return true;
            }
            drop(kept);
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

fn tcp() -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

#[test]
fn a_notification_on_the_link_never_reaches_the_peers_next_incarnation() {
    within(LIMIT, "link moved to a new incarnation", || {
        let first = Engine::new(tcp()).expect("first incarnation");
        let second = Engine::new(tcp()).expect("second incarnation");
        let remote = first.allocate(1 << 20).expect("remote");
        second.allocate(1 << 20).expect("the same buffer again");
        let proxy = LinkProxy::start(first.segment_name());
        let sender = Engine::new(EngineConfig {
            peer_timeout: Duration::from_secs(30),
            ..tcp()
        })
        .expect("sender");
        let local = sender.allocate(1 << 20).expect("local");
        fill(&local, 5);
        let info = sender.open_segment_blocking(&proxy.addr).expect("open");
        assert_eq!(info.engine_id, first.engine_id());
        assert_eq!(
            sender.notify_blocking(info.handle, b"before"),
            Ok(NotifyOutcome::Queued)
        );

        // The data goes straight to the first incarnation (its descriptor's data address);
        // the notification that follows it is swallowed on the link.
        proxy.held.store(true, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        let req = request(Opcode::Write, &local, info.handle, &remote, 0, 1 << 20);
        sender
            .transfer_notify(&[req], b"0:1048576".to_vec(), move |snaps, err| {
                let _ = tx.send((snaps[0].status, err));
            })
            .expect("submit");

        // Sent once every byte was acknowledged: the data is in the first incarnation.
        assert!(proxy.swallowed(b"0:1048576"), "the notification was sent");

        // The peer's name now answers with a new incarnation; opening it again says so, and
        // the link follows it.
        *proxy.to.lock().expect("to") = second.segment_name().to_string();
        let again = sender.open_segment_blocking(&proxy.addr).expect("reopen");
        assert_eq!(again.engine_id, second.engine_id());

        let (status, err) = rx.recv_timeout(WAIT).expect("call ended");
        assert_eq!(status, TransferStatus::Completed, "the data landed");
        let err = err.expect("the notification was not delivered: the call says so");
        assert_eq!(err.code(), "ERR_FERRY_NOTIFY_REFUSED", "{err}");
        assert!(err.to_string().contains("restarted"), "{err}");
        assert_eq!(
            second.notifications_queued(),
            0,
            "the new instance got nothing"
        );

        // The link serves the new incarnation from now on.
        assert_eq!(
            sender.notify_blocking(info.handle, b"after"),
            Ok(NotifyOutcome::Queued)
        );
        let got = |e: &Engine| -> Vec<Vec<u8>> {
            let taken = e.take_notifications(10).expect("take");
            taken.into_iter().map(|n| n.data).collect()
        };
        assert_eq!(got(&first), [b"before".to_vec()]);
        assert_eq!(got(&second), [b"after".to_vec()]);
        sender.close();
        first.close();
        second.close();
    });
}

/// Notifications per second, 8 threads each sending in turn to one target over tcp;
/// prints the rate. Run with `cargo test -p ferry-core --release --test notify_link --
/// --ignored --nocapture` (compare builds interleaved: the machine's load moves it).
#[test]
#[ignore = "prints a rate"]
fn notification_rate() {
    const THREADS: usize = 8;
    const EACH: usize = 2000;
    let target = Engine::new(tcp()).expect("target");
    let sender = Arc::new(Engine::new(tcp()).expect("sender"));
    let seg = sender
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    assert_eq!(
        sender.notify_blocking(seg, b"warm"),
        Ok(NotifyOutcome::Queued)
    );
    let drain = {
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (Engine::clone(&target), stop.clone());
        (
            stop,
            std::thread::spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    let _ = t.take_notifications(4096);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }),
        )
    };
    let start = std::time::Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for _ in 0..EACH {
                    let got = sender.notify_blocking(seg, b"0123456789abcdef");
                    assert!(got.is_ok(), "{got:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("sender thread");
    }
    let secs = start.elapsed().as_secs_f64();
    drain.0.store(true, Ordering::SeqCst);
    drain.1.join().expect("drain");
    eprintln!(
        "notification rate: {:.0}/s ({} in {secs:.2} s)",
        (THREADS * EACH) as f64 / secs,
        THREADS * EACH
    );
    sender.close();
    target.close();
}
