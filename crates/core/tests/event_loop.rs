//! Small awaited requests from a thread with an event loop: the loop watches the reply
//! (`transports::tcp::event_loop`). Here the loop is a poll(2) loop on the test's thread,
//! as libuv's is on a JS thread.

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use ferry_core::auth::Secret;
use ferry_core::event_loop::{self, EventLoop, Interest, Watch, Watcher};
use ferry_core::task::TaskSnapshot;
use ferry_core::{Encrypt, Engine, EngineConfig, Opcode, Region, Request, TransferStatus};
use ferry_testkit::{bytes_at, bytes_of, fill, request, Proxy};

/// A watcher called back and the interest it keeps.
type Ready = (Arc<dyn Watcher>, Rc<Cell<Interest>>);

struct Watched {
    fd: RawFd,
    watcher: Arc<dyn Watcher>,
    interest: Rc<Cell<Interest>>,
}

/// A poll(2) loop: what it watches, and how many callbacks it made.
#[derive(Default)]
struct PollLoop {
    watched: RefCell<Vec<Watched>>,
    callbacks: Cell<u64>,
}

struct PollWatch(Rc<Cell<Interest>>);

impl Watch for PollWatch {
    fn set_interest(&self, interest: Interest) {
        if self.0.get() != Interest::Stop {
            self.0.set(interest);
        }
    }
}

impl Drop for PollWatch {
    fn drop(&mut self) {
        self.0.set(Interest::Stop);
    }
}

impl EventLoop for PollLoop {
    fn watch(&self, fd: RawFd, watcher: Arc<dyn Watcher>) -> std::io::Result<Box<dyn Watch>> {
        let interest = Rc::new(Cell::new(Interest::Read));
        self.watched.borrow_mut().push(Watched {
            fd,
            watcher,
            interest: interest.clone(),
        });
        Ok(Box::new(PollWatch(interest)))
    }
}

impl PollLoop {
    /// Sockets still watched.
    fn live(&self) -> usize {
        self.watched
            .borrow()
            .iter()
            .filter(|w| w.interest.get() != Interest::Stop)
            .count()
    }

    /// One round: waits up to 10 ms for a watched socket, calls back the ready ones.
    fn turn(&self) {
        self.watched
            .borrow_mut()
            .retain(|w| w.interest.get() != Interest::Stop);
        let mut fds: Vec<libc::pollfd> = self
            .watched
            .borrow()
            .iter()
            .map(|w| libc::pollfd {
                fd: w.fd,
                events: match w.interest.get() {
                    Interest::ReadWrite => libc::POLLIN | libc::POLLOUT,
                    _ => libc::POLLIN,
                },
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
        if n <= 0 {
            return;
        }
        let ready: Vec<Ready> = {
            let watched = self.watched.borrow();
            fds.iter()
                .zip(watched.iter())
                .filter(|(p, _)| p.revents != 0)
                .map(|(_, w)| (w.watcher.clone(), w.interest.clone()))
                .collect()
        };
        for (watcher, interest) in ready {
            if interest.get() == Interest::Stop {
                continue;
            }
            self.callbacks.set(self.callbacks.get() + 1);
            let next = watcher.on_ready();
            if interest.get() != Interest::Stop {
                interest.set(next);
            }
        }
    }
}

fn pair() -> (Engine, Engine) {
    let cfg = EngineConfig {
        transports: vec![ferry_core::TransportKind::Tcp],
        peer_timeout: Duration::from_millis(1000),
        ..EngineConfig::default()
    };
    (
        Engine::new(cfg.clone()).expect("target"),
        Engine::new(cfg).expect("initiator"),
    )
}

type Outcome = Arc<Mutex<Option<(Vec<TaskSnapshot>, ThreadId)>>>;

/// Starts an awaited transfer; its outcome and the thread that delivered it land in the
/// returned slot.
fn start(engine: &Engine, reqs: &[Request]) -> Outcome {
    let slot: Outcome = Arc::default();
    let landed = slot.clone();
    engine
        .transfer(reqs, move |snaps| {
            *landed.lock().unwrap() = Some((snaps, std::thread::current().id()));
        })
        .expect("transfer");
    slot
}

/// Turns the loop until `slot` has the outcome (10 s at most).
fn wait(lp: &PollLoop, slot: &Outcome) -> (Vec<TaskSnapshot>, ThreadId) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(out) = slot.lock().unwrap().take() {
            return out;
        }
        assert!(Instant::now() < deadline, "no outcome within 10 s");
        lp.turn();
    }
}

/// Runs 4 KiB awaited WRITEs until one is delivered on this thread (its reply read by the
/// loop), 5 s at most; returns how many it took.
fn warm_up(
    lp: &PollLoop,
    initiator: &Engine,
    local: &Arc<Region>,
    seg: u64,
    remote: &Arc<Region>,
) -> u32 {
    let me = std::thread::current().id();
    let deadline = Instant::now() + Duration::from_secs(5);
    for i in 1.. {
        let slot = start(
            initiator,
            &[request(Opcode::Write, local, seg, remote, 0, 4096)],
        );
        let (snaps, on) = wait(lp, &slot);
        assert_eq!(
            snaps[0].status,
            TransferStatus::Completed,
            "{:?}",
            snaps[0].error
        );
        if on == me {
            return i;
        }
        assert!(Instant::now() < deadline, "the loop never served a request");
        std::thread::sleep(Duration::from_millis(2));
    }
    unreachable!()
}

/// Two engines over tcp, a region on each side (the initiator's filled from `seed`), the
/// target's segment opened, and a poll loop installed on this thread and warmed up (its
/// connection serves requests).
struct Rig {
    target: Engine,
    initiator: Engine,
    local: Arc<Region>,
    remote: Arc<Region>,
    seg: u64,
    lp: Rc<PollLoop>,
}

fn rig(bytes: u64, seed: u64) -> Rig {
    let (target, initiator) = pair();
    let remote = target.allocate(bytes).expect("remote");
    let local = initiator.allocate(bytes).expect("local");
    fill(&local, seed);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    let lp = Rc::new(PollLoop::default());
    event_loop::install(lp.clone());
    warm_up(&lp, &initiator, &local, seg, &remote);
    Rig {
        target,
        initiator,
        local,
        remote,
        seg,
        lp,
    }
}

/// Turns the loop until it watches nothing (100 turns at most); whether it does.
fn let_go(lp: &PollLoop) -> bool {
    for _ in 0..100 {
        if lp.live() == 0 {
            return true;
        }
        lp.turn();
    }
    lp.live() == 0
}

#[test]
fn small_awaited_requests_are_read_by_the_loop_and_land_in_place() {
    let Rig {
        target,
        initiator,
        local,
        remote,
        seg,
        lp,
    } = rig(8 << 20, 7);
    let back = initiator.allocate(8 << 20).expect("back");
    assert_eq!(lp.live(), 1, "one connection watched for the peer");

    // Sizes up to the limit, WRITE then READ back, each delivered on this thread.
    let me = std::thread::current().id();
    let sizes = [1u64, 4096, 4097, 65_536, 20_000];
    let mut offset = 0;
    let mut ranges = Vec::new();
    for (i, &len) in sizes.iter().cycle().take(60).enumerate() {
        let w = start(
            &initiator,
            &[request(Opcode::Write, &local, seg, &remote, offset, len)],
        );
        let (snaps, on) = wait(&lp, &w);
        assert_eq!(
            snaps[0].status,
            TransferStatus::Completed,
            "write {i}: {:?}",
            snaps[0].error
        );
        assert_eq!(on, me, "write {i} was not delivered by the loop");
        let r = start(
            &initiator,
            &[request(Opcode::Read, &back, seg, &remote, offset, len)],
        );
        let (snaps, on) = wait(&lp, &r);
        assert_eq!(
            snaps[0].status,
            TransferStatus::Completed,
            "read {i}: {:?}",
            snaps[0].error
        );
        assert_eq!(on, me, "read {i} was not delivered by the loop");
        ranges.push(offset as usize..(offset + len) as usize);
        offset += len + 13;
    }
    let (sent, there, came_back) = (bytes_of(&local), bytes_of(&remote), bytes_of(&back));
    for r in ranges {
        assert!(there[r.clone()] == sent[r.clone()], "WRITE {r:?} differs");
        assert!(
            came_back[r.clone()] == sent[r.clone()],
            "READ {r:?} differs"
        );
    }
    assert!(lp.callbacks.get() >= 120);

    // Several in flight at once, replies read as they come.
    let slots: Vec<Outcome> = (0..32u64)
        .map(|i| {
            start(
                &initiator,
                &[request(Opcode::Read, &back, seg, &remote, i * 8192, 8192)],
            )
        })
        .collect();
    for s in &slots {
        assert_eq!(wait(&lp, s).0[0].status, TransferStatus::Completed);
    }
    // A large request keeps to the I/O threads.
    let big = start(
        &initiator,
        &[request(Opcode::Read, &back, seg, &remote, 0, 1 << 20)],
    );
    let (snaps, on) = wait(&lp, &big);
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_ne!(on, me, "a 1 MiB READ was copied by the loop's thread");

    initiator.close();
    assert!(let_go(&lp), "the loop still watches after close");
    event_loop::uninstall();
    target.close();
}

#[test]
fn a_dead_peer_fails_what_the_loop_waits_for_in_bounded_time() {
    let Rig {
        target,
        initiator,
        local,
        remote,
        seg,
        lp,
    } = rig(1 << 20, 1);
    // Requests go out; the target closes before the loop reads any reply.
    let slots: Vec<Outcome> = (0..8u64)
        .map(|i| {
            start(
                &initiator,
                &[request(Opcode::Read, &local, seg, &remote, i * 4096, 4096)],
            )
        })
        .collect();
    target.close();
    let closed = Instant::now();
    for s in &slots {
        let (snaps, _) = wait(&lp, s);
        assert!(snaps[0].status.is_terminal(), "{:?}", snaps[0].status);
    }
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "outcomes took {:?}",
        closed.elapsed()
    );
    // Whatever got a reply before the close completed; nothing is left pending, and the
    // loop let go of the socket.
    assert!(let_go(&lp), "the loop still watches a dead connection");
    event_loop::uninstall();
    initiator.close();
}

#[test]
fn uninstalling_the_loop_fails_what_it_waited_for() {
    let Rig {
        target,
        initiator,
        local,
        remote,
        seg,
        lp,
    } = rig(1 << 20, 1);
    let slot = start(
        &initiator,
        &[request(Opcode::Read, &local, seg, &remote, 0, 4096)],
    );
    // The loop goes away before it reads the reply (a worker thread ending).
    event_loop::uninstall();
    assert_eq!(lp.live(), 0, "uninstall left a watch");
    let deadline = Instant::now() + Duration::from_secs(5);
    let snaps = loop {
        if let Some((snaps, _)) = slot.lock().unwrap().take() {
            break snaps;
        }
        assert!(Instant::now() < deadline, "no outcome after uninstall");
        std::thread::sleep(Duration::from_millis(1));
    };
    // Failed over to the pool (which completes it) or failed: never left pending.
    assert!(snaps[0].status.is_terminal());
    // Later requests from this thread, which has no loop now, take the I/O threads.
    let me = std::thread::current().id();
    let slot = start(
        &initiator,
        &[request(Opcode::Write, &local, seg, &remote, 0, 4096)],
    );
    let (snaps, on) = wait(&lp, &slot);
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_ne!(on, me);
    initiator.close();
    target.close();
}

#[test]
fn a_write_the_socket_takes_in_pieces_goes_out_whole_while_others_take_the_pool() {
    let Rig {
        target,
        initiator,
        local,
        remote,
        seg,
        lp,
    } = rig(4 << 20, 3);
    let me = std::thread::current().id();
    // The socket takes 1000 bytes per write: a 64 KiB WRITE leaves its rest, which goes
    // out a piece each time the loop finds the socket writable.
    event_loop::cap_writes_for_tests(Some(1000));
    let calls = lp.callbacks.get();
    let big = start(
        &initiator,
        &[request(Opcode::Write, &local, seg, &remote, 0, 65_536)],
    );
    // Meanwhile the loop's connection is busy: another request takes the I/O threads.
    let small = start(
        &initiator,
        &[request(Opcode::Write, &local, seg, &remote, 1 << 20, 4096)],
    );
    let (snaps, on) = wait(&lp, &small);
    assert_eq!(
        snaps[0].status,
        TransferStatus::Completed,
        "{:?}",
        snaps[0].error
    );
    assert_ne!(
        on, me,
        "a request went on a connection with a write half out"
    );
    let (snaps, on) = wait(&lp, &big);
    assert_eq!(
        snaps[0].status,
        TransferStatus::Completed,
        "{:?}",
        snaps[0].error
    );
    assert_eq!(on, me);
    assert!(
        lp.callbacks.get() - calls >= 60,
        "the rest went out in {} callbacks, not piece by piece",
        lp.callbacks.get() - calls
    );
    event_loop::cap_writes_for_tests(None);
    let (sent, there) = (bytes_of(&local), bytes_of(&remote));
    assert!(
        there[..65_536] == sent[..65_536],
        "the pieced WRITE differs"
    );
    assert!(there[1 << 20..(1 << 20) + 4096] == sent[1 << 20..(1 << 20) + 4096]);
    // Whole again, the connection serves the next request.
    let next = start(
        &initiator,
        &[request(Opcode::Read, &local, seg, &remote, 0, 4096)],
    );
    let (snaps, on) = wait(&lp, &next);
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_eq!(on, me);
    initiator.close();
    event_loop::uninstall();
    target.close();
}

/// The target's handshake refusals of a plaintext peer (`ferry_auth_failures_total`'s
/// `plaintext`).
fn plaintext_refusals(target: &Engine) -> u64 {
    let m = target.metrics();
    m.auth_failures
        .iter()
        .filter(|(reason, _)| *reason == "plaintext")
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn a_loop_connection_to_a_target_that_requires_sealing_carries_its_requests_sealed() {
    // The target requires sealing (`encrypt: true`); the initiator has the default, which
    // on loopback seals when the other end requires it. Every connection crosses a relay
    // that keeps what it relays.
    let relay = Proxy::start();
    let secret = Secret::new(vec![0x42; 32]).expect("secret");
    let config = |encrypt, advertise| EngineConfig {
        transports: vec![ferry_core::TransportKind::Tcp],
        peer_timeout: Duration::from_millis(1000),
        auth_secret: Some(secret.clone()),
        encrypt,
        advertise,
        ..EngineConfig::default()
    };
    let target =
        Engine::new(config(Encrypt::Always, Some(relay.addr().to_string()))).expect("target");
    relay.forward_to(target.local_addr());
    let initiator = Engine::new(config(Encrypt::Auto, None)).expect("initiator");
    let remote = target.allocate(1 << 20).expect("remote");
    let local = initiator.allocate(1 << 20).expect("local");
    let back = initiator.allocate(1 << 20).expect("back");
    fill(&local, 11);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    let lp = Rc::new(PollLoop::default());
    event_loop::install(lp.clone());
    // The loop's own connection serves (its handshake was not refused as plaintext).
    warm_up(&lp, &initiator, &local, seg, &remote);
    relay.capture();
    let me = std::thread::current().id();
    let (at, len) = (8192, 4096);
    for (opcode, region) in [(Opcode::Write, &local), (Opcode::Read, &back)] {
        let slot = start(
            &initiator,
            &[request(opcode, region, seg, &remote, at, len)],
        );
        let (snaps, on) = wait(&lp, &slot);
        assert_eq!(
            snaps[0].status,
            TransferStatus::Completed,
            "{opcode:?}: {:?}",
            snaps[0].error
        );
        assert_eq!(on, me, "{opcode:?} was not delivered by the loop");
    }
    let sent = bytes_at(&local, at, len);
    assert_eq!(
        bytes_at(&back, at, len),
        sent,
        "the READ brought back the WRITE"
    );
    assert!(
        relay.captured_len() > len as usize,
        "the relay saw the requests"
    );
    assert!(
        !relay.relayed(&sent[..64]),
        "the loop connection carried a request's bytes in clear"
    );
    assert_eq!(
        plaintext_refusals(&target),
        0,
        "a plaintext handshake was refused"
    );
    initiator.close();
    assert!(let_go(&lp), "the loop still watches after close");
    event_loop::uninstall();
    target.close();
}
