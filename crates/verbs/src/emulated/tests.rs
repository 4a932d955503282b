//! The emulated device against the verbs rules, its faults, and a peer in another process.
//! Every wait is a bounded poll; each test also runs under a watchdog.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::hooks;
use super::qp::modeled_timeout;
use super::*;
use crate::provider::{AddressVector, QpState, Sge, WcStatus, WorkCompletion, WrOpcode};
use ferry_testkit::within;

const BOUND: Duration = Duration::from_secs(20);
const ALL: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

fn caps(wr: u32, sge: u32) -> QpCaps {
    QpCaps {
        max_send_wr: wr,
        max_recv_wr: 1,
        max_send_sge: sge,
        max_recv_sge: 1,
    }
}

struct End {
    qp: Arc<dyn QueuePair>,
    cq: Arc<dyn CompletionQueue>,
    pd: Arc<dyn ProtectionDomain>,
    gid: Gid,
}

fn end_with(p: &EmulatedProvider, caps: QpCaps, depth: u32) -> End {
    let ctx = p.open(DEVICE_NAME).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(depth).expect("cq");
    let qp = pd.create_qp(&cq, &cq, caps).expect("qp");
    let gid = ctx.query_gid(1, 0).expect("gid");
    End { qp, cq, pd, gid }
}

fn end(p: &EmulatedProvider) -> End {
    end_with(p, caps(64, 4), 256)
}

const INIT_MASK: QpAttrMask = QpAttrMask(
    QpAttrMask::STATE.0
        | QpAttrMask::PKEY_INDEX.0
        | QpAttrMask::PORT.0
        | QpAttrMask::ACCESS_FLAGS.0,
);
const RTR_MASK: QpAttrMask = QpAttrMask(
    QpAttrMask::STATE.0
        | QpAttrMask::AV.0
        | QpAttrMask::PATH_MTU.0
        | QpAttrMask::DEST_QPN.0
        | QpAttrMask::RQ_PSN.0
        | QpAttrMask::MAX_DEST_RD_ATOMIC.0
        | QpAttrMask::MIN_RNR_TIMER.0,
);
const RTS_MASK: QpAttrMask = QpAttrMask(
    QpAttrMask::STATE.0
        | QpAttrMask::SQ_PSN.0
        | QpAttrMask::TIMEOUT.0
        | QpAttrMask::RETRY_CNT.0
        | QpAttrMask::RNR_RETRY.0
        | QpAttrMask::MAX_QP_RD_ATOMIC.0,
);

fn attr(state: QpState, access_flags: u32, dest_qpn: u32, dgid: Gid, timeout: u8) -> QpAttr {
    QpAttr {
        access_flags,
        dest_qpn,
        path_mtu: mtu::MTU_4096,
        timeout,
        retry_cnt: 7,
        av: AddressVector {
            dgid: Some(dgid),
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::state(state)
    }
}

/// RESET → INIT → RTR → RTS towards `dest_qpn` at `dgid`.
fn bring_up(
    qp: &dyn QueuePair,
    access_flags: u32,
    dest_qpn: u32,
    dgid: Gid,
    timeout: u8,
) -> VerbsResult<()> {
    qp.modify(&QpAttr::state(QpState::Reset), QpAttrMask::STATE)?;
    qp.modify(
        &attr(QpState::Init, access_flags, dest_qpn, dgid, timeout),
        INIT_MASK,
    )?;
    qp.modify(
        &attr(QpState::Rtr, access_flags, dest_qpn, dgid, timeout),
        RTR_MASK,
    )?;
    qp.modify(
        &attr(QpState::Rts, access_flags, dest_qpn, dgid, timeout),
        RTS_MASK,
    )
}

/// Two QPs connected to each other; the target accepts `target_access`.
fn connect(a: &End, b: &End, target_access: u32, timeout: u8) {
    bring_up(&*a.qp, ALL, b.qp.qpn(), b.gid, timeout).expect("initiator up");
    bring_up(&*b.qp, target_access, a.qp.qpn(), a.gid, timeout).expect("target up");
}

fn reg(pd: &Arc<dyn ProtectionDomain>, buf: &mut [u8], access_flags: u32) -> Arc<dyn MemoryRegion> {
    // SAFETY: every test declares its buffers before their MRs and keeps them unmoved, so
    // the memory outlives the registration and the work requests that use it.
    unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), access_flags) }.expect("reg_mr")
}

/// `QueuePair::post_send` for these tests, which own their buffers for the whole test.
trait Post {
    fn post(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError>;
}

impl Post for dyn QueuePair {
    fn post(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        // SAFETY: every test declares its buffers before their MRs and keeps them unmoved
        // until its end (see `reg`), so the memory outlives the work requests on it; the
        // emulated device reaches it only through live MRs named by the SGEs' keys (an
        // unknown key or a range outside the MR completes in error). A test looks at a
        // buffer the device may write (a WRITE's target, a READ's destination) only once
        // the work requests on it have completed, been flushed or been refused, and only
        // reads a WRITE's source meanwhile. Remote ranges are registered test buffers, or
        // deliberately bad keys and ranges that the emulated responder refuses.
        unsafe { self.post_send(wrs) }
    }
}

fn sge(mr: &Arc<dyn MemoryRegion>, offset: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr() + offset,
        length,
        lkey: mr.lkey(),
    }
}

fn wr<'a>(
    wr_id: u64,
    opcode: WrOpcode,
    sg: &'a [Sge],
    remote: &Arc<dyn MemoryRegion>,
    offset: u64,
) -> SendWr<'a> {
    SendWr {
        wr_id,
        opcode,
        sg_list: sg,
        signaled: true,
        remote_addr: remote.addr() + offset,
        rkey: remote.rkey(),
    }
}

/// Polls until `n` completions arrived (panics after `bound`).
fn wait_wcs(cq: &Arc<dyn CompletionQueue>, n: usize, bound: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + bound;
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while got.len() < n {
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions after {bound:?}: {got:?}",
            got.len()
        );
        if k == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Every completion arriving within `window`.
fn collect_for(cq: &Arc<dyn CompletionQueue>, window: Duration) -> Vec<WorkCompletion> {
    let end = Instant::now() + window;
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while Instant::now() < end {
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::Errno { errno, .. } => *errno,
        other => panic!("not an errno error: {other}"),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn device_port_and_gid() {
    let p = EmulatedProvider::default();
    let devs = p.devices().expect("devices");
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].name, "emu0");
    let ctx = p.open("emu0").expect("open");
    let port = ctx.query_port(1).expect("port");
    assert_eq!(
        port,
        PortAttr {
            state: port_state::ACTIVE,
            active_mtu: mtu::MTU_4096,
            lid: 0,
            link_layer: link_layer::ETHERNET,
            gid_table_len: 1,
        }
    );
    let gid = ctx.query_gid(1, 0).expect("gid");
    assert_eq!(&gid[..8], &[0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
    assert_eq!(gid, EmulatedProvider::gid());
    assert_eq!(
        errno_of(&ctx.query_port(2).expect_err("port 2")),
        libc::EINVAL
    );
    assert_eq!(
        errno_of(&ctx.query_gid(1, 1).expect_err("index 1")),
        libc::EINVAL
    );
    assert_eq!(
        errno_of(&p.open("mlx5_0").err().expect("no such device")),
        libc::ENODEV
    );
    // A second context is the same device.
    let ctx2 = p.open("emu0").expect("open again");
    assert_eq!(ctx2.query_gid(1, 0).expect("gid"), gid);
}

#[test]
fn keys_and_qpns_are_unique_and_nonzero() {
    let p = EmulatedProvider::default();
    let e = end(&p);
    let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; 64]).collect();
    let mrs: Vec<_> = bufs.iter_mut().map(|b| reg(&e.pd, b, ALL)).collect();
    let mut keys: Vec<u32> = mrs.iter().flat_map(|m| [m.lkey(), m.rkey()]).collect();
    assert!(keys.iter().all(|&k| k != 0));
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 128);
    let qps: Vec<_> = (0..32).map(|_| end(&p)).collect();
    let mut qpns: Vec<u32> = qps.iter().map(|e| e.qp.qpn()).collect();
    assert!(qpns.iter().all(|&n| n > 1 && n <= 0x00ff_ffff));
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 32);
    drop(mrs);
}

#[test]
fn reg_mr_and_create_refuse_bad_arguments() {
    let p = EmulatedProvider::default();
    let ctx = p.open("emu0").expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let mut buf = vec![0u8; 64];
    // SAFETY: refused registrations keep no reference to the buffer.
    let r = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), access::REMOTE_WRITE) };
    assert_eq!(
        errno_of(&r.err().expect("REMOTE_WRITE without LOCAL_WRITE")),
        libc::EINVAL
    );
    // SAFETY: as above.
    let r = unsafe { pd.reg_mr(std::ptr::null_mut(), 64, access::LOCAL_WRITE) };
    assert_eq!(errno_of(&r.err().expect("null")), libc::EINVAL);
    assert_eq!(
        errno_of(&ctx.create_cq(0).err().expect("depth 0")),
        libc::EINVAL
    );
    let cq = ctx.create_cq(16).expect("cq");
    for bad in [caps(4097, 1), caps(16, 17)] {
        let e = pd
            .create_qp(&cq, &cq, bad)
            .err()
            .expect("beyond device limits");
        assert_eq!(errno_of(&e), libc::EINVAL, "{bad:?}");
    }
}

#[test]
fn qp_state_machine_misuse_is_refused() {
    let p = EmulatedProvider::default();
    let (a, b) = (end(&p), end(&p));
    let qp = &*a.qp;
    let at = |s| attr(s, ALL, b.qp.qpn(), b.gid, 14);
    let einval = |r: VerbsResult<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(errno_of(&e), libc::EINVAL, "{what}: {e}");
        e
    };
    let sg: [Sge; 0] = [];
    let post = |what: &str| {
        let e = qp
            .post(&[SendWr {
                wr_id: 1,
                opcode: WrOpcode::RdmaWrite,
                sg_list: &sg,
                signaled: true,
                remote_addr: 0,
                rkey: 1,
            }])
            .expect_err(what);
        assert_eq!(e.index, 0);
        assert_eq!(errno_of(&e.error), libc::EINVAL, "{what}");
    };
    post("post in RESET");
    einval(
        qp.modify(&at(QpState::Rtr), RTR_MASK),
        "RESET -> RTR skips INIT",
    );
    einval(qp.modify(&at(QpState::Rts), RTS_MASK), "RESET -> RTS");
    let e = einval(
        qp.modify(
            &at(QpState::Init),
            QpAttrMask(INIT_MASK.0 & !QpAttrMask::PORT.0),
        ),
        "INIT without PORT",
    );
    assert!(e.to_string().contains("IBV_QP_PORT"), "{e}");
    einval(
        qp.modify(
            &at(QpState::Init),
            QpAttrMask(INIT_MASK.0 & !QpAttrMask::STATE.0),
        ),
        "no STATE bit",
    );
    einval(
        qp.modify(&at(QpState::Init), INIT_MASK | QpAttrMask::DEST_QPN),
        "extra bit",
    );
    let mut bad_port = at(QpState::Init);
    bad_port.port_num = 2;
    einval(qp.modify(&bad_port, INIT_MASK), "port 2");
    qp.modify(&at(QpState::Init), INIT_MASK)
        .expect("RESET -> INIT");
    post("post in INIT");
    einval(
        qp.modify(&at(QpState::Rts), RTS_MASK),
        "INIT -> RTS skips RTR",
    );
    einval(
        qp.modify(
            &at(QpState::Rtr),
            QpAttrMask(RTR_MASK.0 & !QpAttrMask::DEST_QPN.0),
        ),
        "RTR without DEST_QPN",
    );
    let mut no_grh = at(QpState::Rtr);
    no_grh.av.dgid = None;
    einval(qp.modify(&no_grh, RTR_MASK), "RoCE without GRH");
    qp.modify(&at(QpState::Rtr), RTR_MASK).expect("INIT -> RTR");
    post("post in RTR");
    einval(
        qp.modify(
            &at(QpState::Rts),
            QpAttrMask(RTS_MASK.0 & !QpAttrMask::TIMEOUT.0),
        ),
        "RTS without TIMEOUT",
    );
    einval(qp.modify(&at(QpState::Init), INIT_MASK), "RTR -> INIT");
    qp.modify(&at(QpState::Rts), RTS_MASK).expect("RTR -> RTS");
    qp.modify(&QpAttr::state(QpState::Err), QpAttrMask::STATE)
        .expect("-> ERR");
    einval(qp.modify(&at(QpState::Rts), RTS_MASK), "ERR -> RTS");
    qp.modify(&QpAttr::state(QpState::Reset), QpAttrMask::STATE)
        .expect("-> RESET");
    bring_up(qp, ALL, b.qp.qpn(), b.gid, 14).expect("again from RESET");
}

#[test]
fn wr_and_sge_limits_and_err_flushes_everything() {
    within(BOUND, "limits", || {
        let p = EmulatedProvider::default();
        let a = end_with(&p, caps(4, 2), 64);
        let b = end(&p);
        // The target stays in INIT: its device drops every packet, so WRs stay outstanding.
        bring_up(&*a.qp, ALL, b.qp.qpn(), b.gid, 20).expect("up");
        let mut src = vec![1u8; 4096];
        let mut dst = vec![0u8; 4096];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let three = [sge(&smr, 0, 8), sge(&smr, 8, 8), sge(&smr, 16, 8)];
        let e =
            a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &three, &dmr, 0)])
                .expect_err("3 SGEs");
        assert_eq!((e.index, errno_of(&e.error)), (0, libc::EINVAL));
        let one = [sge(&smr, 0, 8)];
        let wrs: Vec<_> = (10..15)
            .map(|id| wr(id, WrOpcode::RdmaWrite, &one, &dmr, 0))
            .collect();
        let e = a.qp.post(&wrs).expect_err("5 WRs on a 4-deep SQ");
        assert_eq!((e.index, errno_of(&e.error)), (4, libc::ENOMEM));
        assert!(collect_for(&a.cq, Duration::from_millis(50)).is_empty());
        a.qp.modify(&QpAttr::state(QpState::Err), QpAttrMask::STATE)
            .expect("ERR");
        let mut wcs = wait_wcs(&a.cq, 4, BOUND);
        // Flushing freed the slots; a WR posted in ERR is accepted and flushed too.
        a.qp.post(&[wr(20, WrOpcode::RdmaWrite, &one, &dmr, 0)])
            .expect("posting in ERR is accepted");
        wcs.extend(wait_wcs(&a.cq, 1, BOUND));
        let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, vec![10, 11, 12, 13, 20]);
        assert!(wcs
            .iter()
            .all(|w| w.status == WcStatus::WrFlushErr && w.qp_num == a.qp.qpn()));
        assert!(dst.iter().all(|&x| x == 0));
        drop((smr, dmr));
    });
}

#[test]
fn cq_overflow_makes_poll_fail() {
    within(BOUND, "overflow", || {
        let p = EmulatedProvider::default();
        let a = end_with(&p, caps(16, 1), 2);
        let b = end(&p);
        connect(&a, &b, ALL, 14);
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let one = [sge(&smr, 0, 64)];
        let wrs: Vec<_> = (0..4)
            .map(|id| wr(id, WrOpcode::RdmaWrite, &one, &dmr, 0))
            .collect();
        a.qp.post(&wrs).expect("post");
        let deadline = Instant::now() + BOUND;
        let err = loop {
            // Poll with an empty slice so nothing is consumed until the CQ fails.
            match a.cq.poll(&mut []) {
                Err(e) => break e,
                Ok(_) => {
                    assert!(Instant::now() < deadline, "the CQ never overflowed");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        assert_eq!(errno_of(&err), libc::EOVERFLOW);
        assert!(
            a.cq.poll(&mut [WorkCompletion::default(); 4]).is_err(),
            "overflow is sticky"
        );
        drop((smr, dmr));
    });
}

#[test]
fn local_key_errors_complete_loc_prot_err() {
    within(BOUND, "lkey", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let other_pd = p.open("emu0").expect("ctx").alloc_pd().expect("pd");
        let mut src = vec![7u8; 4096];
        let mut foreign = vec![7u8; 4096];
        let mut ro = vec![0u8; 4096];
        let mut dst = vec![0u8; 4096];
        let smr = reg(&a.pd, &mut src, ALL);
        let fmr = reg(&other_pd, &mut foreign, ALL);
        let romr = reg(&a.pd, &mut ro, 0);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let bad_key = Sge {
            lkey: smr.lkey() ^ 0x5a5a_0001,
            ..sge(&smr, 0, 64)
        };
        let outside = sge(&smr, 4000, 200);
        let other_pd_sge = sge(&fmr, 0, 64);
        let cases: [(&str, Sge, WrOpcode); 4] = [
            ("unknown lkey", bad_key, WrOpcode::RdmaWrite),
            ("outside its MR", outside, WrOpcode::RdmaWrite),
            ("MR of another PD", other_pd_sge, WrOpcode::RdmaWrite),
            (
                "READ into an MR without LOCAL_WRITE",
                sge(&romr, 0, 64),
                WrOpcode::RdmaRead,
            ),
        ];
        for (what, s, op) in cases {
            bring_up(&*a.qp, ALL, b.qp.qpn(), b.gid, 14).expect("reconnect");
            let sg = [s];
            let ok = [sge(&smr, 0, 8)];
            a.qp.post(&[
                wr(1, op, &sg, &dmr, 0),
                wr(2, WrOpcode::RdmaWrite, &ok, &dmr, 0),
            ])
            .expect("post");
            let wcs = wait_wcs(&a.cq, 2, BOUND);
            assert_eq!(wcs[0].status, WcStatus::LocProtErr, "{what}");
            assert_eq!(
                wcs[1].status,
                WcStatus::WrFlushErr,
                "{what}: the next WR is flushed"
            );
            assert!(dst.iter().all(|&x| x == 0), "{what}: remote untouched");
        }
        drop((smr, fmr, romr, dmr));
    });
}

#[test]
fn remote_access_errors_leave_the_target_untouched() {
    within(BOUND, "rkey", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        let other_pd = p.open("emu0").expect("ctx").alloc_pd().expect("pd");
        let mut src = vec![0xAAu8; 8192];
        let mut dst = vec![0x11u8; 4096];
        let mut ro = vec![0x22u8; 4096];
        let mut foreign = vec![0x33u8; 4096];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let romr = reg(&b.pd, &mut ro, access::LOCAL_WRITE | access::REMOTE_READ);
        let fmr = reg(&other_pd, &mut foreign, ALL);
        let sg = [sge(&smr, 0, 64)];
        let big = [sge(&smr, 0, 8192)];
        let bad_rkey = SendWr {
            rkey: dmr.rkey() ^ 0x0101_0101,
            ..wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)
        };
        let cases: Vec<(&str, SendWr<'_>, u32)> = vec![
            ("unknown rkey", bad_rkey, ALL),
            (
                "past the end",
                wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 4090),
                ALL,
            ),
            (
                "longer than the MR",
                wr(1, WrOpcode::RdmaWrite, &big, &dmr, 0),
                ALL,
            ),
            (
                "before the start",
                SendWr {
                    remote_addr: dmr.addr() - 8,
                    ..wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)
                },
                ALL,
            ),
            (
                "MR without REMOTE_WRITE",
                wr(1, WrOpcode::RdmaWrite, &sg, &romr, 0),
                ALL,
            ),
            (
                "QP without REMOTE_WRITE",
                wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0),
                access::LOCAL_WRITE | access::REMOTE_READ,
            ),
            (
                "QP without REMOTE_READ",
                wr(1, WrOpcode::RdmaRead, &sg, &dmr, 0),
                access::LOCAL_WRITE | access::REMOTE_WRITE,
            ),
            (
                "MR of another PD",
                wr(1, WrOpcode::RdmaWrite, &sg, &fmr, 0),
                ALL,
            ),
        ];
        for (what, w, target_access) in cases {
            connect(&a, &b, target_access, 14);
            a.qp.post(&[w]).expect("post");
            let wcs = wait_wcs(&a.cq, 1, BOUND);
            assert_eq!(wcs[0].status, WcStatus::RemAccessErr, "{what}");
            assert!(dst.iter().all(|&x| x == 0x11), "{what}: target changed");
            assert!(ro.iter().all(|&x| x == 0x22), "{what}: target changed");
            assert!(foreign.iter().all(|&x| x == 0x33), "{what}: target changed");
            assert!(
                src.iter().all(|&x| x == 0xAA),
                "{what}: READ destination changed"
            );
        }
        drop((smr, dmr, romr, fmr));
    });
}

#[test]
fn write_and_read_mebibytes_between_two_contexts() {
    within(BOUND, "write/read", || {
        const LEN: usize = 4 << 20;
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let mut src = pattern(LEN, 3);
        let mut back = vec![0u8; LEN];
        let mut dst = vec![0u8; LEN];
        let smr = reg(&a.pd, &mut src, ALL);
        let bmr = reg(&a.pd, &mut back, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let half = (LEN / 2) as u32;
        // Two SGEs, and an unsignaled WR first: only the signaled one completes.
        let first = [sge(&smr, 0, half)];
        let second = [
            sge(&smr, u64::from(half), half / 2),
            sge(&smr, u64::from(half + half / 2), half / 2),
        ];
        let w1 = SendWr {
            signaled: false,
            ..wr(1, WrOpcode::RdmaWrite, &first, &dmr, 0)
        };
        let w2 = wr(2, WrOpcode::RdmaWrite, &second, &dmr, u64::from(half));
        a.qp.post(&[w1, w2]).expect("post writes");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
            (2, WcStatus::Success, WrOpcode::RdmaWrite)
        );
        assert_eq!(wcs[0].byte_len, half);
        assert!(dst == src, "written bytes differ");
        let into = [sge(&bmr, 0, half), sge(&bmr, u64::from(half), half)];
        a.qp.post(&[wr(3, WrOpcode::RdmaRead, &into, &dmr, 0)])
            .expect("post read");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
            (3, WcStatus::Success, WrOpcode::RdmaRead)
        );
        assert_eq!(wcs[0].byte_len, LEN as u32);
        assert!(back == src, "read bytes differ");
        assert!(
            collect_for(&a.cq, Duration::from_millis(20)).is_empty(),
            "the unsignaled WR completed"
        );
        drop((smr, bmr, dmr));
    });
}

#[test]
fn many_small_wrs_complete_in_posting_order() {
    within(BOUND, "order", || {
        let p = EmulatedProvider::default();
        let a = end_with(&p, caps(256, 1), 1024);
        let b = end(&p);
        connect(&a, &b, ALL, 14);
        let mut src = pattern(4096, 9);
        let mut dst = vec![0u8; 4096];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sgs: Vec<[Sge; 1]> = (0..256u64).map(|i| [sge(&smr, i * 16, 16)]).collect();
        let wrs: Vec<_> = sgs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let op = if i % 3 == 0 {
                    WrOpcode::RdmaRead
                } else {
                    WrOpcode::RdmaWrite
                };
                wr(i as u64, op, s, &dmr, i as u64 * 16)
            })
            .collect();
        a.qp.post(&wrs).expect("post");
        let wcs = wait_wcs(&a.cq, 256, BOUND);
        let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, (0..256).collect::<Vec<_>>());
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        drop((smr, dmr));
    });
}

#[test]
fn unanswered_wr_ends_retry_exceeded_after_the_modeled_timeout() {
    within(BOUND, "timeout", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        // The target is connected to someone else: its device drops our packets.
        bring_up(&*a.qp, ALL, b.qp.qpn(), b.gid, 14).expect("up");
        bring_up(&*b.qp, ALL, 0x42, b.gid, 14).expect("target up elsewhere");
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        let t = modeled_timeout(14, 7);
        let start = Instant::now();
        a.qp.post(&[
            wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0),
            wr(2, WrOpcode::RdmaWrite, &sg, &dmr, 0),
        ])
        .expect("post");
        let wcs = wait_wcs(&a.cq, 2, t + Duration::from_secs(5));
        let took = start.elapsed();
        assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
        assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
        assert!(
            took >= t.mul_f64(0.8) && took < t + Duration::from_secs(2),
            "{took:?} vs {t:?}"
        );
        assert!(dst.iter().all(|&x| x == 0));
        drop((smr, dmr));
    });
}

#[test]
fn unreachable_responder_ends_retry_exceeded() {
    within(BOUND, "unreachable", || {
        let p = EmulatedProvider::default();
        let a = end(&p);
        let nowhere: Gid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1,
        ];
        bring_up(&*a.qp, ALL, 0x1234, nowhere, 12).expect("up");
        let mut src = vec![1u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let sg = [sge(&smr, 0, 64)];
        let t = modeled_timeout(12, 7);
        let start = Instant::now();
        a.qp.post(&[SendWr {
            wr_id: 7,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sg,
            signaled: true,
            remote_addr: 0x1000,
            rkey: 0x42,
        }])
        .expect("post");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::RetryExcErr));
        assert!(
            start.elapsed() >= t.mul_f64(0.8),
            "{:?} vs {t:?}",
            start.elapsed()
        );
        drop(smr);
    });
}

#[test]
fn a_responder_held_past_the_retry_budget_still_completes() {
    within(BOUND, "held responder", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        // The transport's default ack timeout and retry count.
        connect(&a, &b, ALL, 14);
        let t = modeled_timeout(14, 7);
        let mut src = pattern(4096, 3);
        let mut back = vec![0u8; 4096];
        let mut dst = vec![0u8; 4096];
        let smr = reg(&a.pd, &mut src, ALL);
        let bmr = reg(&a.pd, &mut back, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let stall = hooks::Stall::new(b.qp.qpn());
        let from = [sge(&smr, 0, 4096)];
        let into = [sge(&bmr, 0, 4096)];
        a.qp.post(&[
            wr(1, WrOpcode::RdmaWrite, &from, &dmr, 0),
            wr(2, WrOpcode::RdmaRead, &into, &dmr, 0),
        ])
        .expect("post");
        assert!(
            stall.wait_arrived(1, BOUND),
            "the write never reached the responder"
        );
        // The responder sits on the write for twice the retry budget. Its process is alive
        // (a hardware responder would have acknowledged long ago), so this is no
        // RetryExcErr, however long it takes.
        let held = collect_for(&a.cq, t * 2);
        assert!(
            held.is_empty(),
            "completed while the responder was held: {held:?}"
        );
        stall.release();
        let wcs = wait_wcs(&a.cq, 2, BOUND);
        let ids: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(ids, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
        assert!(dst == src, "the write landed");
        assert!(back == src, "the read returned it");
        drop((smr, bmr, dmr));
    });
}

#[test]
fn a_responder_gone_while_held_ends_retry_exceeded_in_the_modeled_window() {
    within(BOUND, "gone responder", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 12);
        let t = modeled_timeout(12, 7);
        let mut src = vec![7u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        let stall = hooks::Stall::new(b.qp.qpn());

        // Gone at once (the responder's connection closes unanswered, as when its process
        // dies): the budget counts from the send.
        let start = Instant::now();
        a.qp.post(&[
            wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0),
            wr(2, WrOpcode::RdmaWrite, &sg, &dmr, 0),
        ])
        .expect("post");
        assert!(stall.wait_arrived(1, BOUND), "never reached the responder");
        stall.sever();
        let wcs = wait_wcs(&a.cq, 2, BOUND);
        let took = start.elapsed();
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RetryExcErr));
        assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
        assert!(
            took >= t.mul_f64(0.8) && took <= t + Duration::from_secs(2),
            "{took:?} vs {t:?}"
        );

        // Held past the budget, then gone: nothing while the peer lives, RetryExcErr as
        // soon as the loss is seen (the budget from the send has long run out).
        stall.hold_again();
        connect(&a, &b, ALL, 12);
        a.qp.post(&[wr(3, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        assert!(stall.wait_arrived(2, BOUND), "never reached the responder");
        let held = collect_for(&a.cq, t * 2);
        assert!(
            held.is_empty(),
            "completed while the responder was held: {held:?}"
        );
        let severed = Instant::now();
        stall.sever();
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::RetryExcErr));
        assert!(
            severed.elapsed() < Duration::from_secs(2),
            "{:?} after the loss",
            severed.elapsed()
        );
        assert!(dst.iter().all(|&x| x == 0), "nothing executed");
        drop((smr, dmr));
    });
}

#[test]
fn a_target_qp_destroyed_while_held_ends_retry_exceeded_in_the_modeled_window() {
    within(BOUND, "destroyed target", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 12);
        let t = modeled_timeout(12, 7);
        let mut src = vec![7u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        let stall = hooks::Stall::new(b.qp.qpn());
        let start = Instant::now();
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        assert!(stall.wait_arrived(1, BOUND), "never reached the responder");
        // The target QP goes away while the responder holds its packet; the device then
        // drops it (and every retransmission) and the initiator runs out of retries.
        let End { qp: target_qp, .. } = b;
        drop(target_qp);
        stall.release();
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        let took = start.elapsed();
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RetryExcErr));
        assert!(
            took >= t.mul_f64(0.8) && took <= t + Duration::from_secs(2),
            "{took:?} vs {t:?}"
        );
        assert!(dst.iter().all(|&x| x == 0), "nothing executed");
        drop((smr, dmr));
    });
}

/// Accepts one connection on a non-blocking listener, waiting at most `bound`.
fn accept_within(
    l: &std::os::unix::net::UnixListener,
    bound: Duration,
) -> std::os::unix::net::UnixStream {
    let deadline = Instant::now() + bound;
    loop {
        match l.accept() {
            Ok((s, _)) => return s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no connection within {bound:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn a_responder_whose_backlog_stays_full_is_waited_for() {
    within(BOUND, "full backlog", || {
        use super::device::responder_addr;
        use super::qp::CONNECT_TIMEOUT;
        use super::wire::{Request, Response, Status, REQUEST_LEN};
        use std::os::fd::AsRawFd;
        use std::os::unix::net::{UnixListener, UnixStream};

        // A responder of our own under a GID of its own, with room for one connection
        // that nobody accepts: the listener lives, but connecting to it blocks.
        let mut gid: Gid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xba, 0xc1, 0x09, 0, 0, 0, 0, 0,
        ];
        gid[12..].copy_from_slice(&std::process::id().to_be_bytes());
        let addr = responder_addr(&gid).expect("address");
        let listener = UnixListener::bind_addr(&addr).expect("bind");
        // SAFETY: listen(2) on a socket we own; it only changes the backlog.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        listener.set_nonblocking(true).expect("nonblocking");
        let filler = UnixStream::connect_addr(&addr).expect("fills the backlog");

        let p = EmulatedProvider::default();
        let a = end(&p);
        bring_up(&*a.qp, ALL, 0x1234, gid, 12).expect("up");
        let t = modeled_timeout(12, 7);
        let mut src = vec![3u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let sg = [sge(&smr, 0, 64)];
        a.qp.post(&[SendWr {
            wr_id: 9,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sg,
            signaled: true,
            remote_addr: 0x1000,
            rkey: 0x42,
        }])
        .expect("post");
        // Two connect attempts time out meanwhile, and the budget passes twice over.
        let held = collect_for(&a.cq, CONNECT_TIMEOUT * 2 + t * 2);
        assert!(
            held.is_empty(),
            "completed while the responder was busy: {held:?}"
        );

        // The responder accepts at last: the QP's connection comes in behind the filler,
        // and its work request is answered.
        drop(accept_within(&listener, BOUND));
        drop(filler);
        let mut conn = accept_within(&listener, BOUND);
        conn.set_nonblocking(false).expect("blocking");
        conn.set_read_timeout(Some(BOUND)).expect("timeout");
        let mut header = [0u8; REQUEST_LEN];
        conn.read_exact(&mut header).expect("request");
        let req = Request::decode(&header).expect("well formed");
        assert_eq!((req.dst_qpn, req.len), (0x1234, 64));
        let mut payload = vec![0u8; 64];
        conn.read_exact(&mut payload).expect("payload");
        assert_eq!(payload, src);
        let resp = Response {
            status: Status::Ok,
            seq: req.seq,
            len: 0,
        };
        conn.write_all(&resp.encode()).expect("response");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
        drop(smr);
    });
}

#[test]
fn modeled_timeout_values() {
    let t = modeled_timeout(14, 7);
    assert!(
        t > Duration::from_millis(530) && t < Duration::from_millis(540),
        "{t:?}"
    );
    assert_eq!(modeled_timeout(0, 0), Duration::from_nanos(4096));
}

#[test]
fn fault_silent_loss_never_completes_while_others_do() {
    within(BOUND, "silent loss", || {
        let p = EmulatedProvider::new(EmulatedFaults {
            silent_loss: 1.0,
            ..Default::default()
        });
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let mut src = vec![5u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post lost");
        p.set_faults(EmulatedFaults::default());
        a.qp.post(&[
            wr(2, WrOpcode::RdmaWrite, &sg, &dmr, 0),
            wr(3, WrOpcode::RdmaRead, &sg, &dmr, 0),
        ])
        .expect("post");
        let wcs = collect_for(&a.cq, Duration::from_secs(1));
        let ids: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(ids, vec![(2, WcStatus::Success), (3, WcStatus::Success)]);
        // Not even the error state reports it.
        a.qp.modify(&QpAttr::state(QpState::Err), QpAttrMask::STATE)
            .expect("ERR");
        assert!(collect_for(&a.cq, Duration::from_millis(50)).is_empty());
        drop((smr, dmr));
    });
}

#[test]
fn fault_silent_loss_is_seeded() {
    within(BOUND, "seeded loss", || {
        let run = || {
            let p = EmulatedProvider::new(
                EmulatedFaults::parse("silent_loss=0.5,seed=11").expect("spec"),
            );
            let (a, b) = (end(&p), end(&p));
            connect(&a, &b, ALL, 14);
            let mut src = vec![5u8; 64];
            let mut dst = vec![0u8; 64];
            let smr = reg(&a.pd, &mut src, ALL);
            let dmr = reg(&b.pd, &mut dst, ALL);
            let sg = [sge(&smr, 0, 64)];
            let wrs: Vec<_> = (0..32)
                .map(|id| wr(id, WrOpcode::RdmaWrite, &sg, &dmr, 0))
                .collect();
            a.qp.post(&wrs).expect("post");
            // A marker posted without faults completes after every surviving WR (RC order).
            p.set_faults(EmulatedFaults::default());
            a.qp.post(&[wr(999, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
                .expect("marker");
            let mut ids = Vec::new();
            let deadline = Instant::now() + BOUND;
            while ids.last() != Some(&999) {
                assert!(Instant::now() < deadline, "marker never completed: {ids:?}");
                ids.extend(
                    collect_for(&a.cq, Duration::from_millis(10))
                        .iter()
                        .map(|w| w.wr_id),
                );
            }
            ids.pop();
            drop((smr, dmr));
            ids
        };
        let (x, y) = (run(), run());
        assert_eq!(x, y, "same seed, same losses");
        assert!(x.len() > 4 && x.len() < 28, "{x:?}");
    });
}

#[test]
fn fault_retry_exceeded_and_remote_access_and_delay() {
    within(BOUND, "faults", || {
        let p = EmulatedProvider::new(EmulatedFaults {
            retry_exceeded: 1.0,
            ..Default::default()
        });
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 12);
        let mut src = vec![9u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        let t = modeled_timeout(12, 7);
        let start = Instant::now();
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        let took = start.elapsed();
        assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
        assert!(took >= t.mul_f64(0.8), "{took:?} vs {t:?}");
        assert!(dst.iter().all(|&x| x == 0));

        p.set_faults(EmulatedFaults {
            remote_access: 1.0,
            ..Default::default()
        });
        connect(&a, &b, ALL, 12);
        a.qp.post(&[wr(2, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::RemAccessErr));
        assert!(
            dst.iter().all(|&x| x == 0),
            "remote_access touched the target"
        );

        let delay = Duration::from_millis(150);
        p.set_faults(EmulatedFaults {
            delay,
            ..Default::default()
        });
        connect(&a, &b, ALL, 12);
        let start = Instant::now();
        a.qp.post(&[wr(3, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        let wcs = wait_wcs(&a.cq, 1, BOUND);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::Success));
        assert!(start.elapsed() >= delay, "{:?}", start.elapsed());
        assert!(dst.iter().all(|&x| x == 9));
        drop((smr, dmr));
    });
}

fn qp_threads(qpn: u32) -> usize {
    let prefix = format!("emuqp{qpn:06x}");
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .filter(|c| c.trim_end().starts_with(&prefix))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn dropping_a_qp_stops_its_threads() {
    within(BOUND, "threads", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        wait_wcs(&a.cq, 1, BOUND);
        let qpn = a.qp.qpn();
        assert_eq!(qp_threads(qpn), 2, "worker and receiver");
        drop(smr);
        drop(a);
        // The drop joined both threads. A joined thread can still be listed for a moment:
        // the kernel wakes its joiner (clearing the tid) early in the thread's exit, and
        // drops it from /proc/self/task only at the end of it. So: gone within a bound.
        let joined = Instant::now();
        while qp_threads(qpn) != 0 && joined.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        assert_eq!(qp_threads(qpn), 0, "threads joined on drop");
        drop(dmr);
    });
}

#[test]
fn responder_drops_a_malformed_connection_and_keeps_serving() {
    within(BOUND, "malformed", || {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let addr = device::responder_addr(&b.gid).expect("addr");
        let mut raw = std::os::unix::net::UnixStream::connect_addr(&addr).expect("connect");
        raw.write_all(&[0xEE; wire::REQUEST_LEN])
            .expect("send garbage");
        raw.set_read_timeout(Some(BOUND)).expect("timeout");
        let mut byte = [0u8; 1];
        assert_eq!(raw.read(&mut byte).expect("read"), 0, "connection dropped");
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        assert_eq!(wait_wcs(&a.cq, 1, BOUND)[0].status, WcStatus::Success);
        drop((smr, dmr));
    });
}

const LEAK_ENV: &str = "FERRY_EMU_VERBS_LEAK_CHILD";
const LEAK_TEST: &str = "emulated::tests::dropping_the_last_context_stops_the_responder";

fn emu_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|c| c.trim_end().to_owned())
                .filter(|c| c.starts_with("emuqp") || c.starts_with("emu-verbs"))
                .collect()
        })
        .unwrap_or_default()
}

fn responder_listening(gid: &Gid) -> bool {
    let name = format!("@{}", device::responder_name(gid));
    std::fs::read_to_string("/proc/net/unix")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some(name.as_str()))
        })
        .unwrap_or(false)
}

/// Runs alone in a child process, so no other test's device or threads interfere.
fn leak_check_child() {
    let gid = EmulatedProvider::gid();
    assert!(emu_threads().is_empty(), "{:?}", emu_threads());
    for round in 0..2 {
        let p = EmulatedProvider::default();
        let (a, b) = (end(&p), end(&p));
        connect(&a, &b, ALL, 14);
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.pd, &mut src, ALL);
        let dmr = reg(&b.pd, &mut dst, ALL);
        let sg = [sge(&smr, 0, 64)];
        a.qp.post(&[wr(1, WrOpcode::RdmaWrite, &sg, &dmr, 0)])
            .expect("post");
        assert_eq!(wait_wcs(&a.cq, 1, BOUND)[0].status, WcStatus::Success);
        assert!(
            responder_listening(&gid),
            "round {round}: responder not listening"
        );
        assert!(!emu_threads().is_empty());
        drop((smr, dmr, a, b, p));
        // The QPs joined their threads; the device joins the responder's when the last
        // context goes, but a responder connection thread may still be finishing.
        let deadline = Instant::now() + BOUND;
        while !emu_threads().is_empty() || responder_listening(&gid) {
            assert!(
                Instant::now() < deadline,
                "round {round}: left behind {:?}, listening {}",
                emu_threads(),
                responder_listening(&gid)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    println!("EMU-LEAK-CHECK passed");
}

#[test]
fn dropping_the_last_context_stops_the_responder() {
    if std::env::var_os(LEAK_ENV).is_some() {
        leak_check_child();
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let out = within(BOUND * 2, "leak child", || {
        let exe = std::env::current_exe().expect("exe");
        Command::new(exe)
            .args(["--exact", LEAK_TEST, "--nocapture", "--test-threads=1"])
            .env(LEAK_ENV, "1")
            .output()
            .expect("run child")
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("EMU-LEAK-CHECK passed"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const CHILD_ENV: &str = "FERRY_EMU_VERBS_TARGET";
const CHILD_TEST: &str = "emulated::tests::cross_process_write_read_then_target_killed";
const CHILD_LEN: usize = 1 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Gid> {
    let mut g = [0u8; 16];
    if s.len() != 32 {
        return None;
    }
    for (i, slot) in g.iter_mut().enumerate() {
        *slot = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(g)
}

/// The target process: registers an MR, prints its coordinates, connects to the QP read
/// from stdin, then serves until stdin closes (or it is killed).
fn run_target_child() {
    let p = EmulatedProvider::default();
    let t = end(&p);
    let mut mem = pattern(CHILD_LEN, 77);
    let mr = reg(&t.pd, &mut mem, ALL);
    println!(
        "EMU-TARGET qpn={} gid={} rkey={} addr={} pid={}",
        t.qp.qpn(),
        hex(&t.gid),
        mr.rkey(),
        mr.addr(),
        std::process::id()
    );
    let mut line = String::new();
    let stdin = std::io::stdin();
    if stdin.lock().read_line(&mut line).is_err() {
        return;
    }
    let mut it = line.split_whitespace();
    let (Some(qpn), Some(gid)) = (
        it.next().and_then(|q| q.parse().ok()),
        it.next().and_then(unhex),
    ) else {
        return;
    };
    bring_up(&*t.qp, ALL, qpn, gid, 14).expect("target up");
    println!("EMU-TARGET ready");
    // Serve until the parent closes stdin or kills us.
    let mut rest = String::new();
    let _ = stdin.lock().read_to_string(&mut rest);
    drop(mr);
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace().find_map(|kv| {
        kv.strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .map(str::to_owned)
    })
}

fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + BOUND;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the ")" that closes the command name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned));
        if matches!(state.as_deref(), Some("T") | Some("t")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "child {pid} never stopped: {stat}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn cross_process_write_read_then_target_killed() {
    if std::env::var_os(CHILD_ENV).is_some() {
        run_target_child();
        return;
    }
    if std::env::var_os(LEAK_ENV).is_some() {
        return;
    }
    within(Duration::from_secs(60), "cross process", || {
        let exe = std::env::current_exe().expect("exe");
        let child = Command::new(exe)
            .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn target");
        let mut child = KillOnDrop(child);
        let pid = child.0.id();
        let stdout = child.0.stdout.take().expect("stdout");
        let mut stdin = child.0.stdin.take().expect("stdin");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may print the test's name on the same line first.
                if let Some(at) = line.find("EMU-TARGET") {
                    if tx.send(line[at..].to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        let hello = rx.recv_timeout(BOUND).expect("target coordinates");
        let parse =
            |k: &str| field(&hello, k).unwrap_or_else(|| panic!("{k} missing in {hello:?}"));
        let t_qpn: u32 = parse("qpn").parse().expect("qpn");
        let t_gid = unhex(&parse("gid")).expect("gid");
        let rkey: u32 = parse("rkey").parse().expect("rkey");
        let raddr: u64 = parse("addr").parse().expect("addr");
        assert_eq!(parse("pid").parse::<u32>().expect("pid"), pid);
        assert_ne!(
            t_gid,
            EmulatedProvider::gid(),
            "another process, another GID"
        );

        let p = EmulatedProvider::default();
        let a = end(&p);
        writeln!(stdin, "{} {}", a.qp.qpn(), hex(&a.gid)).expect("send qpn");
        stdin.flush().expect("flush");
        assert_eq!(rx.recv_timeout(BOUND).expect("ready"), "EMU-TARGET ready");
        bring_up(&*a.qp, ALL, t_qpn, t_gid, 14).expect("up");

        let mut src = pattern(CHILD_LEN, 5);
        let mut back = vec![0u8; CHILD_LEN];
        let smr = reg(&a.pd, &mut src, ALL);
        let bmr = reg(&a.pd, &mut back, ALL);
        fn remote(
            wr_id: u64,
            opcode: WrOpcode,
            sg: &[Sge],
            raddr: u64,
            rkey: u32,
        ) -> Vec<SendWr<'_>> {
            vec![SendWr {
                wr_id,
                opcode,
                sg_list: sg,
                signaled: true,
                remote_addr: raddr,
                rkey,
            }]
        }
        let into = [sge(&bmr, 0, CHILD_LEN as u32)];
        a.qp.post(&remote(1, WrOpcode::RdmaRead, &into, raddr, rkey))
            .expect("read original");
        assert_eq!(wait_wcs(&a.cq, 1, BOUND)[0].status, WcStatus::Success);
        assert!(
            back == pattern(CHILD_LEN, 77),
            "read the target's original bytes"
        );
        let from = [sge(&smr, 0, CHILD_LEN as u32)];
        a.qp.post(&remote(2, WrOpcode::RdmaWrite, &from, raddr, rkey))
            .expect("write");
        a.qp.post(&remote(3, WrOpcode::RdmaRead, &into, raddr, rkey))
            .expect("read back");
        let wcs = wait_wcs(&a.cq, 2, BOUND);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        assert!(back == src, "read back what was written");

        // Freeze the target so the next WR stays unanswered, then kill it.
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        wait_stopped(pid);
        let t = modeled_timeout(14, 7);
        let start = Instant::now();
        a.qp.post(&remote(4, WrOpcode::RdmaWrite, &from, raddr, rkey))
            .expect("post to stopped");
        a.qp.post(&remote(5, WrOpcode::RdmaRead, &into, raddr, rkey))
            .expect("post to stopped");
        child.0.kill().expect("SIGKILL");
        child.0.wait().expect("reap");
        let wcs = wait_wcs(&a.cq, 2, t + Duration::from_secs(5));
        let took = start.elapsed();
        assert_eq!((wcs[0].wr_id, wcs[0].status), (4, WcStatus::RetryExcErr));
        assert_eq!((wcs[1].wr_id, wcs[1].status), (5, WcStatus::WrFlushErr));
        assert!(
            took >= t.mul_f64(0.8),
            "ended too early: {took:?} < 80% of {t:?}"
        );
        assert!(
            took <= t + Duration::from_secs(2),
            "ended too late: {took:?} vs {t:?}"
        );
        drop((smr, bmr));
    });
}
