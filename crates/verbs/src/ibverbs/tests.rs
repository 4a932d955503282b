//! What can be checked without a NIC, and the `hw_` tests that run on real hardware
//! (`cargo test -p ferry-verbs hw_`; they skip with the reason where no device exists).

use std::time::{Duration, Instant};

use super::*;
use crate::provider::{access, link_layer, mtu, port_state, AddressVector, QpState, Sge};

#[test]
fn load_resolves_the_verbs() {
    let p = IbverbsProvider::load().expect("libibverbs.so.1 is installed on build machines");
    assert_eq!(p.name(), "ibverbs");
}

#[test]
fn a_missing_library_is_unavailable() {
    match IbverbsProvider::load_library("libferry-no-such-verbs.so.1") {
        Err(VerbsError::Unavailable(m)) => {
            assert!(
                m.starts_with("libferry-no-such-verbs.so.1 could not be loaded: "),
                "{m}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn devices_lists_or_says_why_not() {
    let p = IbverbsProvider::load().expect("load");
    match p.devices() {
        Ok(devs) => assert!(!devs.is_empty() && devs.iter().all(|d| !d.name.is_empty())),
        Err(VerbsError::Unavailable(m)) => {
            assert!(m.starts_with("no RDMA device: ibv_get_device_list"), "{m}");
            let e = p.open("mlx5_0").err().expect("no device to open");
            assert!(matches!(e, VerbsError::Unavailable(_)), "{e:?}");
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

#[test]
fn the_binary_does_not_link_libibverbs() {
    let exe = std::env::current_exe().expect("exe");
    let out = match std::process::Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
    {
        Ok(o) if o.status.success() => o,
        other => {
            println!("skipped: readelf unavailable ({other:?})");
            return;
        }
    };
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(
        !needed.is_empty(),
        "readelf printed no NEEDED entries:\n{dynamic}"
    );
    for line in &needed {
        assert!(
            !line.contains("ibverbs") && !line.contains("rdmacm"),
            "{} links RDMA libraries: {line}",
            exe.display()
        );
    }
}

/// The first device, or `None` after printing why the hardware test is skipped.
fn hw_device() -> Option<(IbverbsProvider, String)> {
    let p = match IbverbsProvider::load() {
        Ok(p) => p,
        Err(e) => {
            println!("skipped: no RDMA device ({e})");
            return None;
        }
    };
    let wanted = std::env::var("FERRY_RDMA_DEVICE").ok();
    match p.devices() {
        Ok(devs) => {
            let name = wanted.unwrap_or_else(|| devs[0].name.clone());
            Some((p, name))
        }
        Err(e) => {
            println!("skipped: no RDMA device ({e})");
            None
        }
    }
}

fn gid_index() -> u32 {
    std::env::var("FERRY_RDMA_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn hw_open_query_and_register() {
    let Some((p, name)) = hw_device() else { return };
    let ctx = p.open(&name).expect("open");
    assert_eq!(ctx.device_name(), name);
    let port = ctx.query_port(1).expect("query_port");
    println!("{name} port 1: {port:?}");
    assert!(port.gid_table_len > 0);
    if port.state != port_state::ACTIVE {
        println!("warning: {name} port 1 is not ACTIVE");
    }
    let gid = ctx.query_gid(1, gid_index()).expect("query_gid");
    println!("{name} gid[{}] = {gid:02x?}", gid_index());
    let pd = ctx.alloc_pd().expect("pd");
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` outlives the MR, dropped first below.
    let mr = unsafe {
        pd.reg_mr(
            buf.as_mut_ptr(),
            buf.len(),
            access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
        )
    }
    .expect("reg_mr");
    assert_eq!(mr.addr(), buf.as_ptr() as u64);
    assert_eq!(mr.len(), buf.len());
    drop(mr);
}

#[test]
fn hw_loopback_write_and_read() {
    let Some((p, name)) = hw_device() else { return };
    const LEN: usize = 4 << 20;
    let all = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    let ctx = p.open(&name).expect("open");
    let port = ctx.query_port(1).expect("port");
    let gid = ctx.query_gid(1, gid_index()).expect("gid");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64).expect("cq");
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let a = pd.create_qp(&cq, &cq, caps).expect("qp a");
    let b = pd.create_qp(&cq, &cq, caps).expect("qp b");
    let global = port.link_layer == link_layer::ETHERNET || gid != [0; 16];
    for (qp, peer) in [(&a, b.qpn()), (&b, a.qpn())] {
        let mut at = QpAttr::state(QpState::Init);
        at.access_flags = all;
        at.port_num = 1;
        qp.modify(
            &at,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .expect("INIT");
        at.state = QpState::Rtr;
        at.path_mtu = port.active_mtu.min(mtu::MTU_4096);
        at.dest_qpn = peer;
        at.av = AddressVector {
            dlid: port.lid,
            dgid: global.then_some(gid),
            sgid_index: gid_index() as u8,
            hop_limit: 64,
            port_num: 1,
        };
        qp.modify(
            &at,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .expect("RTR");
        at.state = QpState::Rts;
        qp.modify(
            &at,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .expect("RTS");
    }
    let mut src: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; LEN];
    let mut back = vec![0u8; LEN];
    // SAFETY: the buffers outlive the MRs, which are dropped at the end of the test first.
    let (smr, dmr, bmr) = unsafe {
        (
            pd.reg_mr(src.as_mut_ptr(), LEN, all).expect("src"),
            pd.reg_mr(dst.as_mut_ptr(), LEN, all).expect("dst"),
            pd.reg_mr(back.as_mut_ptr(), LEN, all).expect("back"),
        )
    };
    let wait = |n: usize| -> Vec<WorkCompletion> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        let mut buf = [WorkCompletion::default(); 8];
        while got.len() < n {
            let k = cq.poll(&mut buf).expect("poll");
            got.extend_from_slice(&buf[..k]);
            assert!(Instant::now() < deadline, "completions missing: {got:?}");
        }
        got
    };
    let sg = [Sge {
        addr: smr.addr(),
        length: LEN as u32,
        lkey: smr.lkey(),
    }];
    // SAFETY: `src` and `dst` outlive their MRs, and neither is touched until the
    // completion below has been polled; `dmr`'s rkey grants LEN bytes from `dmr.addr()`.
    unsafe {
        a.post_send(&[SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sg,
            signaled: true,
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        }])
    }
    .expect("post write");
    let wcs = wait(1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::Success),
        "{wcs:?}"
    );
    let sg = [Sge {
        addr: bmr.addr(),
        length: LEN as u32,
        lkey: bmr.lkey(),
    }];
    // SAFETY: as above; `back` is only read after the READ's completion.
    unsafe {
        a.post_send(&[SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaRead,
            sg_list: &sg,
            signaled: true,
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        }])
    }
    .expect("post read");
    let wcs = wait(1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (2, WcStatus::Success),
        "{wcs:?}"
    );
    drop((smr, dmr, bmr));
    assert!(dst == src, "written bytes differ");
    assert!(back == src, "read bytes differ");
}
