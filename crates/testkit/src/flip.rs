//! A TCP relay that flips one bit of every connection's byte stream at a chosen offset
//! in a chosen direction: corruption on the wire, as a broken NIC, switch or an attacker
//! on the path would make it. The tamper tests of sealed (`encrypt`) connections run it
//! between two engines.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a relay thread looks at the stop flag while its socket is quiet.
const TICK: Duration = Duration::from_millis(10);

/// Which way the flipped byte travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    /// From the initiator (the connecting side) to the target.
    Target,
    /// From the target back to the initiator.
    Initiator,
}

/// A relay listening on its own loopback port, forwarding every connection to `backend`
/// and flipping the lowest bit of the byte at offset `at` of each connection's stream
/// toward `toward`. Its threads stop when it drops.
pub struct FlipRelay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    flipped: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl FlipRelay {
    /// Starts the relay.
    pub fn start(backend: SocketAddr, toward: Toward, at: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay listen");
        listener.set_nonblocking(true).expect("relay nonblocking");
        let addr = listener.local_addr().expect("relay addr");
        let stop = Arc::new(AtomicBool::new(false));
        let flipped = Arc::new(AtomicU64::new(0));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s, f, o) = (stop.clone(), flipped.clone(), open.clone());
        let accept = std::thread::spawn(move || {
            accept_loop(listener, backend, Flip { toward, at }, s, f, o)
        });
        Self {
            addr,
            stop,
            flipped,
            open,
            accept: Some(accept),
        }
    }

    /// The address initiators connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many bytes the relay flipped so far (one per connection that got that far).
    pub fn flipped(&self) -> u64 {
        self.flipped.load(Ordering::SeqCst)
    }
}

impl Drop for FlipRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in std::mem::take(&mut *self.open.lock().expect("open")) {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Flip {
    toward: Toward,
    at: u64,
}

fn accept_loop(
    listener: TcpListener,
    backend: SocketAddr,
    flip: Flip,
    stop: Arc<AtomicBool>,
    flipped: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
) {
    let mut pumps = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(TICK);
                continue;
            }
            Err(_) => break,
        };
        let Ok(server) = TcpStream::connect(backend) else {
            continue;
        };
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
        open.lock().expect("open").extend([c3, s3]);
        let to_target = (flip.toward == Toward::Target).then_some(flip.at);
        let to_initiator = (flip.toward == Toward::Initiator).then_some(flip.at);
        let (st1, st2, f1, f2) = (stop.clone(), stop.clone(), flipped.clone(), flipped.clone());
        pumps.push(std::thread::spawn(move || {
            pump(client, server, to_target, &st1, &f1)
        }));
        pumps.push(std::thread::spawn(move || {
            pump(s2, c2, to_initiator, &st2, &f2)
        }));
    }
    for p in pumps {
        let _ = p.join();
    }
}

/// Copies `from` → `to`, flipping the byte at offset `flip_at` (if any), until either
/// closes or the relay stops.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    flip_at: Option<u64>,
    stop: &AtomicBool,
    flipped: &AtomicU64,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut offset = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if let Some(at) = flip_at {
            if (offset..offset + n as u64).contains(&at) {
                buf[(at - offset) as usize] ^= 0x01;
                flipped.fetch_add(1, Ordering::SeqCst);
            }
        }
        offset += n as u64;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
