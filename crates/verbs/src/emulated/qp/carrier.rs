//! Carrying a queue pair's work requests: the worker thread that sends them and completes
//! them in order, the connection to the responder, the receivers that read its answers,
//! and the modeled transport timeout for requests known to be lost.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::*;

/// The pause before connecting again to a responder whose backlog was full.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// How long a blocked socket write waits before the worker checks timeouts again (a
/// write to a live responder that does not read waits as long as the peer lives and the
/// QP stays connected).
const WRITE_SLICE: Duration = Duration::from_millis(20);

impl QpShared {
    pub(super) fn run_worker(self: Arc<Self>) {
        let mut g = lock(&self.inner);
        loop {
            if g.stop {
                return;
            }
            let now = Instant::now();
            self.settle(&mut g, now);
            if g.state == QpState::Rts {
                if let Some(idx) = g.sq.iter().position(|e| matches!(e.phase, Phase::Queued)) {
                    g = if g.conn.is_none() && !g.conn_broken {
                        self.open_connection(g)
                    } else {
                        self.send_one(g, idx, now)
                    };
                    continue;
                }
            }
            // Deadlines of everything on the wire, and the head's delivery time: completions
            // behind the head wait for it whatever their own time.
            let head_due = match g.sq.front().map(|e| e.phase) {
                Some(Phase::Done { not_before, .. }) => Some(not_before),
                _ => None,
            };
            let wake =
                g.sq.iter()
                    .filter_map(|e| match e.phase {
                        Phase::Sent { deadline, .. } => deadline,
                        _ => None,
                    })
                    .chain(head_due)
                    .min();
            g = match wake {
                Some(at) => {
                    let wait = at
                        .saturating_duration_since(now)
                        .max(Duration::from_micros(100));
                    self.cond
                        .wait_timeout(g, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Validates and sends the queued entry at `idx`; returns with the lock held again.
    fn send_one<'a>(
        self: &'a Arc<Self>,
        mut g: MutexGuard<'a, Inner>,
        idx: usize,
        now: Instant,
    ) -> MutexGuard<'a, Inner> {
        let mut payload = match self.prepare(&g.sq[idx]) {
            Ok(p) => p,
            Err(status) => {
                let delay = g.sq[idx].delay;
                g.sq[idx].phase = Phase::Done {
                    status,
                    not_before: now + delay,
                };
                return g;
            }
        };
        g.sq[idx].phase = Phase::Sent {
            sent: now,
            deadline: None,
        };
        let Some((stream, gen)) = self.connection(&g) else {
            // Unreachable responder: the entry times out like an unanswered packet.
            arm_lost(&mut g, now);
            return g;
        };
        let e = &g.sq[idx];
        if e.corrupt {
            flip_one_byte(&mut payload);
        }
        let req = Request {
            op: match e.opcode {
                WrOpcode::RdmaWrite => Op::Write,
                WrOpcode::RdmaRead => Op::Read,
            },
            seq: e.seq,
            src_qpn: self.qpn,
            dst_qpn: g.attrs.dest_qpn,
            src_gid: self.registry.gid,
            rkey: e.rkey,
            remote_addr: e.remote_addr,
            len: e.byte_len as u32,
        };
        drop(g);
        let sent = self.write_frame(&stream, gen, &req.encode(), &payload);
        let mut g = lock(&self.inner);
        if !sent && g.gen == gen {
            lose_conn(&mut g, Instant::now());
        }
        g
    }

    /// Checks the entry's local SGEs; for WRITE gathers the bytes to send.
    fn prepare(&self, e: &Entry) -> Result<Vec<u8>, WcStatus> {
        if e.byte_len > u64::from(wire::MAX_LEN) {
            return Err(WcStatus::LocLenErr);
        }
        let mut payload = Vec::new();
        if e.opcode == WrOpcode::RdmaWrite {
            payload.resize(e.byte_len as usize, 0);
        }
        let mut off = 0usize;
        for sge in &e.sges {
            if sge.length == 0 {
                continue;
            }
            let mr = self
                .registry
                .by_lkey(sge.lkey)
                .filter(|mr| mr.pd == self.pd && mr.contains(sge.addr, u64::from(sge.length)))
                .ok_or(WcStatus::LocProtErr)?;
            let len = sge.length as usize;
            match e.opcode {
                WrOpcode::RdmaWrite => {
                    if !mr.read_into(sge.addr, &mut payload[off..off + len]) {
                        return Err(WcStatus::LocProtErr);
                    }
                }
                WrOpcode::RdmaRead => {
                    if mr.access & access::LOCAL_WRITE == 0 {
                        return Err(WcStatus::LocProtErr);
                    }
                }
            }
            off += len;
        }
        Ok(payload)
    }

    /// Scatters READ response bytes into the entry's SGEs.
    fn scatter(&self, e: &Entry, data: &[u8]) -> WcStatus {
        let mut off = 0usize;
        for sge in &e.sges {
            if sge.length == 0 {
                continue;
            }
            let len = sge.length as usize;
            let ok = self
                .registry
                .by_lkey(sge.lkey)
                .filter(|mr| mr.pd == self.pd && mr.access & access::LOCAL_WRITE != 0)
                .is_some_and(|mr| mr.write_from(sge.addr, &data[off..off + len]));
            if !ok {
                return WcStatus::LocProtErr;
            }
            off += len;
        }
        WcStatus::Success
    }

    /// The open connection to the destination's responder (`None` when it broke).
    fn connection(&self, g: &Inner) -> Option<(Arc<UnixStream>, u64)> {
        if g.conn_broken {
            return None;
        }
        g.conn.as_ref().map(|c| (c.stream.clone(), c.gen))
    }

    /// Connects to the destination's responder without holding the lock (the connect is
    /// bounded by `CONNECT_TIMEOUT`) and installs the connection unless the QP moved on
    /// meanwhile; a failure marks the connection broken, so work requests time out.
    fn open_connection<'a>(self: &'a Arc<Self>, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        let gen = g.gen;
        let dgid = g.attrs.dgid;
        drop(g);
        let opened = dgid
            .ok_or_else(|| std::io::Error::from(ErrorKind::AddrNotAvailable))
            .and_then(|dgid| connect_bounded(&dgid, CONNECT_TIMEOUT))
            .and_then(|s| {
                s.set_write_timeout(Some(WRITE_SLICE))?;
                let r = s.try_clone()?;
                Ok((s, r))
            });
        let mut g = lock(&self.inner);
        if g.gen != gen || g.stop || g.conn.is_some() || g.conn_broken {
            if let Ok((s, _)) = opened {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            return g;
        }
        let (stream, reader) = match opened {
            Ok(pair) => pair,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // The listener exists but its backlog stayed full: the peer lives and does
                // not accept yet (stopped or starved). Its work requests wait, queued.
                tracing::debug!(qpn = self.qpn, error = %e, "emulated verbs: responder busy, connecting again");
                return self
                    .cond
                    .wait_timeout(g, CONNECT_BACKOFF)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Err(e) => {
                tracing::debug!(qpn = self.qpn, error = %e, "emulated verbs: responder unreachable");
                g.conn_broken = true;
                return g;
            }
        };
        let qp = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("emuqp{:06x}r", self.qpn))
            .spawn(move || qp.run_receiver(reader, gen));
        match spawned {
            Ok(h) => {
                g.receivers.retain(|h| !h.is_finished());
                g.receivers.push(h);
                g.conn = Some(Conn {
                    stream: Arc::new(stream),
                    gen,
                });
            }
            Err(e) => {
                tracing::warn!(qpn = self.qpn, error = %e, "emulated verbs: no receiver thread");
                g.conn_broken = true;
            }
        }
        g
    }

    /// Writes a frame; gives up when the connection fails or is replaced or the QP stops.
    /// Blocked writes wake every `WRITE_SLICE` to run the timeouts.
    fn write_frame(&self, stream: &UnixStream, gen: u64, header: &[u8], payload: &[u8]) -> bool {
        for part in [header, payload] {
            let mut off = 0;
            while off < part.len() {
                match (&*stream).write(&part[off..]) {
                    Ok(0) => return false,
                    Ok(n) => off += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        let mut g = lock(&self.inner);
                        self.settle(&mut g, Instant::now());
                        if g.stop || g.gen != gen {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            }
        }
        true
    }

    fn run_receiver(self: Arc<Self>, mut stream: UnixStream, gen: u64) {
        let broken = loop {
            let mut header = [0u8; wire::RESPONSE_LEN];
            if stream.read_exact(&mut header).is_err() {
                break true;
            }
            let resp = match Response::decode(&header) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(qpn = self.qpn, error = %e, "emulated verbs: malformed response, dropping the connection");
                    break true;
                }
            };
            let mut data = Vec::new();
            match (&mut stream)
                .take(u64::from(resp.len))
                .read_to_end(&mut data)
            {
                Ok(n) if n == resp.len as usize => {}
                _ => break true,
            }
            let mut g = lock(&self.inner);
            if g.gen != gen || g.stop {
                break false;
            }
            let Some(idx) =
                g.sq.iter()
                    .position(|e| e.seq == resp.seq && matches!(e.phase, Phase::Sent { .. }))
            else {
                continue;
            };
            if let (Status::Dropped, 0) = (resp.status, resp.len) {
                // The responder dropped it, as it would every retransmission: the retry
                // budget runs from the send.
                if let Phase::Sent {
                    sent,
                    deadline: None,
                } = g.sq[idx].phase
                {
                    let deadline = g.attrs.transport_timeout().map(|t| sent + t);
                    g.sq[idx].phase = Phase::Sent { sent, deadline };
                }
                drop(g);
                self.cond.notify_all();
                continue;
            }
            let e = &g.sq[idx];
            let status = match resp.status {
                Status::AccessNak if resp.len == 0 => WcStatus::RemAccessErr,
                Status::Ok if e.opcode == WrOpcode::RdmaWrite && resp.len == 0 => WcStatus::Success,
                Status::Ok
                    if e.opcode == WrOpcode::RdmaRead && u64::from(resp.len) == e.byte_len =>
                {
                    if e.corrupt {
                        flip_one_byte(&mut data);
                    }
                    self.scatter(e, &data)
                }
                _ => {
                    tracing::warn!(qpn = self.qpn, seq = resp.seq, len = resp.len, "emulated verbs: response does not match its request, dropping the connection");
                    drop(g);
                    break true;
                }
            };
            let not_before = Instant::now() + e.delay;
            g.sq[idx].phase = Phase::Done { status, not_before };
            drop(g);
            self.cond.notify_all();
        };
        if broken {
            let mut g = lock(&self.inner);
            if g.gen == gen {
                lose_conn(&mut g, Instant::now());
            }
            drop(g);
            self.cond.notify_all();
        }
    }

    /// Times out unanswered entries and delivers finished ones in order; an error moves
    /// the QP to ERR, which flushes everything behind it.
    fn settle(&self, g: &mut Inner, now: Instant) {
        for e in g.sq.iter_mut() {
            if let Phase::Sent {
                deadline: Some(d), ..
            } = e.phase
            {
                if d <= now {
                    e.phase = Phase::Done {
                        status: WcStatus::RetryExcErr,
                        not_before: now,
                    };
                }
            }
        }
        while let Some(head) = g.sq.front() {
            let status = if g.state == QpState::Err {
                WcStatus::WrFlushErr
            } else {
                match head.phase {
                    Phase::Done { status, not_before } if not_before <= now => status,
                    _ => break,
                }
            };
            let Some(e) = g.sq.pop_front() else { break };
            if status != WcStatus::Success || e.signaled {
                self.cq.push(WorkCompletion {
                    wr_id: e.wr_id,
                    status,
                    opcode: e.opcode,
                    byte_len: if status == WcStatus::Success {
                        e.byte_len as u32
                    } else {
                        0
                    },
                    qp_num: self.qpn,
                    vendor_err: 0,
                });
            }
            if status != WcStatus::Success && g.state != QpState::Err {
                tracing::debug!(
                    qpn = self.qpn,
                    wr_id = e.wr_id,
                    status = status.name(),
                    "emulated QP enters ERR"
                );
                g.state = QpState::Err;
                close_conn(g);
            }
        }
    }
}

/// The `corrupt` fault: flips the bits of the middle byte of what a work request carries.
fn flip_one_byte(bytes: &mut [u8]) {
    let middle = bytes.len() / 2;
    if let Some(b) = bytes.get_mut(middle) {
        *b ^= 0xff;
    }
}

pub(super) fn close_conn(g: &mut Inner) {
    if let Some(c) = g.conn.take() {
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
    }
    g.gen += 1;
}

/// The responder's connection failed or closed while the QP used it: the responder's
/// process died or its device closed, so every request still unanswered is lost.
fn lose_conn(g: &mut Inner, now: Instant) {
    g.conn_broken = true;
    close_conn(g);
    arm_lost(g, now);
}

/// Starts the retry budget of every sent entry without a deadline, all of them lost: each
/// ends `RetryExcErr` when its budget, counted from its send, has run out, and not before
/// `now`, when the loss was seen.
fn arm_lost(g: &mut Inner, now: Instant) {
    let Some(budget) = g.attrs.transport_timeout() else {
        return;
    };
    for e in g.sq.iter_mut() {
        if let Phase::Sent {
            sent,
            deadline: None,
        } = e.phase
        {
            e.phase = Phase::Sent {
                sent,
                deadline: Some((sent + budget).max(now)),
            };
        }
    }
}

/// Connects to the responder of `gid`, giving up after `timeout` (a blocking unix connect
/// otherwise waits forever when the listener's backlog is full, e.g. a stopped peer).
fn connect_bounded(gid: &Gid, timeout: Duration) -> std::io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let name = responder_name(gid);
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > addr.sun_path.len() {
        return Err(ErrorKind::InvalidInput.into());
    }
    // Abstract name: a leading NUL, then the name (no terminator).
    for (slot, &b) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *slot = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    // SAFETY: `tv` is a valid timeval of the size passed; a unix connect honours SO_SNDTIMEO.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `addr` is an initialized sockaddr_un and `len` does not exceed its size.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(UnixStream::from(owned))
}
