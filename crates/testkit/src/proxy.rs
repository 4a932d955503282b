//! A TCP forwarder between an initiator and a target whose connections a test can freeze
//! (held open, nothing forwarded: a peer that went silent, or a restart the initiator did
//! not see), cut (closed without a goodbye: a crash as the initiator sees it), or corrupt
//! (one byte flipped at a chosen place of a stream: a wire that damages data), and whose
//! relayed bytes it can keep (`capture`: what an eavesdropper on the wire would read).

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a forwarding thread looks at the proxy's state while its socket is quiet.
const TICK: Duration = Duration::from_millis(10);

/// A forwarder listening on its own loopback port; every connection it accepts is
/// forwarded to its backend (refused until it has one). Its threads stop when it drops.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct State {
    backend: Mutex<Option<SocketAddr>>,
    stop: AtomicBool,
    /// Connections numbered below this are frozen.
    frozen_below: AtomicU64,
    /// Every connection holds what it reads, forwarding nothing, until resumed.
    paused: AtomicBool,
    /// Bytes read and held while paused, in every connection together.
    held: AtomicU64,
    /// The same, by connection number (those that held any).
    held_by: Mutex<BTreeMap<u64, u64>>,
    next: AtomicU64,
    /// Both sockets of each connection, by number, to cut them.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    /// Where a byte is flipped in streams of connections accepted from now on.
    flip: Mutex<Option<Flip>>,
    /// Bytes flipped so far, every stream together.
    flipped: AtomicU64,
    /// Whether relayed bytes are kept in `captured`.
    capturing: AtomicBool,
    /// The bytes relayed while capturing, per stream: (connection, towards the target).
    captured: Mutex<std::collections::HashMap<(u64, bool), Vec<u8>>>,
}

/// One byte flipped in each stream of one direction that gets that far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flip {
    /// Initiator to target (a WRITE's payload) when true, else target to initiator (a
    /// READ's).
    pub to_target: bool,
    /// The byte's position in its stream, counted from the connection's first byte (past
    /// the handshake's few hundred bytes, so that the data is hit, not the handshake).
    pub at: u64,
}

impl Proxy {
    /// Starts a forwarder with no backend yet ([`Proxy::forward_to`]).
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listen");
        listener.set_nonblocking(true).expect("proxy nonblocking");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(State {
            backend: Mutex::new(None),
            stop: AtomicBool::new(false),
            frozen_below: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            held: AtomicU64::new(0),
            held_by: Mutex::default(),
            next: AtomicU64::new(0),
            open: Mutex::default(),
            flip: Mutex::default(),
            flipped: AtomicU64::new(0),
            capturing: AtomicBool::new(false),
            captured: Mutex::default(),
        });
        let proxy = Self {
            addr,
            state: state.clone(),
            threads: Mutex::default(),
        };
        let accept = std::thread::spawn(move || accept_loop(listener, state));
        proxy.threads.lock().expect("threads").push(accept);
        proxy
    }

    /// Connections accepted from now on go to `backend`.
    pub fn forward_to(&self, backend: SocketAddr) {
        *self.state.backend.lock().expect("backend") = Some(backend);
    }

    /// The address initiators connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections open now forward nothing more, either way, and stay open; later
    /// ones are forwarded.
    pub fn freeze(&self) {
        let next = self.state.next.load(Ordering::SeqCst);
        self.state.frozen_below.store(next, Ordering::SeqCst);
    }

    /// Every connection stops forwarding, losing nothing: what is sent meanwhile is held
    /// (a slow or congested network) until [`Proxy::resume`].
    pub fn pause(&self) {
        self.state.paused.store(true, Ordering::SeqCst);
    }

    /// Bytes held since the pause, every connection and direction together.
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Bytes held since the pause by each connection that held any: (its number, the
    /// bytes), by number. Which connection carries what is the engine's choice; a test
    /// picks one by what it holds ([`Proxy::cut_connection`]).
    pub fn holding(&self) -> Vec<(u64, u64)> {
        let by = self.state.held_by.lock().expect("held_by");
        by.iter().map(|(&n, &b)| (n, b)).collect()
    }

    /// Paused connections forward again, what they held first.
    pub fn resume(&self) {
        self.state.paused.store(false, Ordering::SeqCst);
    }

    /// Connections accepted from now on have one byte flipped where `flip` says (none:
    /// forwarded intact again).
    pub fn corrupt(&self, flip: Option<Flip>) {
        *self.state.flip.lock().expect("flip") = flip;
    }

    /// How many bytes were flipped so far (one per stream that got as far as its `at`).
    pub fn flipped(&self) -> u64 {
        self.state.flipped.load(Ordering::SeqCst)
    }

    /// Keeps every byte relayed from now on, both directions, after any flip.
    pub fn capture(&self) {
        self.state.capturing.store(true, Ordering::SeqCst);
    }

    /// Whether some stream relayed since [`Proxy::capture`] carried `pattern`.
    pub fn relayed(&self, pattern: &[u8]) -> bool {
        let captured = self.state.captured.lock().expect("captured");
        !pattern.is_empty()
            && captured
                .values()
                .any(|stream| stream.windows(pattern.len()).any(|w| w == pattern))
    }

    /// Bytes relayed since [`Proxy::capture`], every stream together.
    pub fn captured_len(&self) -> usize {
        let captured = self.state.captured.lock().expect("captured");
        captured.values().map(Vec::len).sum()
    }

    /// The connections open now are closed on both sides (no goodbye reaches either
    /// end); later ones are forwarded.
    pub fn cut(&self) {
        let open = std::mem::take(&mut *self.state.open.lock().expect("open"));
        for (_, a, b) in open {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    /// Closes connection `number` on both sides (as [`Proxy::cut`], for that one only):
    /// what it held is lost; the others go on as they are.
    pub fn cut_connection(&self, number: u64) {
        let mut open = self.state.open.lock().expect("open");
        open.retain(|(n, a, b)| {
            if *n != number {
                return true;
            }
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            false
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.cut();
        for t in std::mem::take(&mut *self.threads.lock().expect("threads")) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut pumps = Vec::new();
    while !state.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(TICK);
                continue;
            }
            Err(_) => break,
        };
        let backend = *state.backend.lock().expect("backend");
        let Some(Ok(server)) = backend.map(TcpStream::connect) else {
            continue; // dropping the client closes it: the backend is not there
        };
        let number = state.next.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nonblocking(false);
        for s in [&client, &server] {
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(TICK));
        }
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        state.open.lock().expect("open").push((number, c3, s3));
        let (st1, st2) = (state.clone(), state.clone());
        let flip = *state.flip.lock().expect("flip");
        let up = flip.filter(|f| f.to_target).map(|f| f.at);
        let down = flip.filter(|f| !f.to_target).map(|f| f.at);
        pumps.push(std::thread::spawn(move || {
            pump(client, server, (number, true), st1, up)
        }));
        pumps.push(std::thread::spawn(move || {
            pump(s2, c2, (number, false), st2, down)
        }));
    }
    for p in pumps {
        let _ = p.join();
    }
}

/// Copies `from` → `to` until either closes, the proxy stops, or (frozen) for ever silent;
/// flips the bits of the byte at stream position `flip` on its way. `stream`: the
/// connection's number, and whether this is its direction towards the target.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    stream: (u64, bool),
    state: Arc<State>,
    flip: Option<u64>,
) {
    let number = stream.0;
    let mut buf = vec![0u8; 64 << 10];
    let mut held = Vec::new();
    let mut passed = 0u64;
    let frozen = |s: &State| number < s.frozen_below.load(Ordering::SeqCst);
    while !state.stop.load(Ordering::SeqCst) {
        if frozen(&state) {
            std::thread::sleep(TICK);
            continue;
        }
        let paused = state.paused.load(Ordering::SeqCst);
        if !paused && !held.is_empty() {
            if to.write_all(&held).is_err() {
                break;
            }
            held.clear();
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        // Read before the freeze and checked after it: what a frozen connection carries
        // is dropped.
        if frozen(&state) {
            continue;
        }
        if let Some(at) = flip.filter(|at| (passed..passed + n as u64).contains(at)) {
            buf[(at - passed) as usize] ^= 0xFF;
            state.flipped.fetch_add(1, Ordering::SeqCst);
        }
        passed += n as u64;
        if state.capturing.load(Ordering::SeqCst) {
            let mut captured = state.captured.lock().expect("captured");
            captured
                .entry(stream)
                .or_default()
                .extend_from_slice(&buf[..n]);
        }
        if paused {
            held.extend_from_slice(&buf[..n]);
            state.held.fetch_add(n as u64, Ordering::SeqCst);
            *state
                .held_by
                .lock()
                .expect("held_by")
                .entry(number)
                .or_default() += n as u64;
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
