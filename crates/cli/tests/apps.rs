//! The applications against real daemons: three `anode node` processes on
//! loopback in a line 10.0.0.1 — 10.0.0.2 — 10.0.0.3, each test with its own
//! network (fresh ports and run directories), killed when the test ends.
mod common;

use common::{ANODE, Line, Proc};
use std::path::Path;
use std::process::Command;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn ping_across_two_hops() {
    let net = Line::start();
    for extra in [&[][..], &["--compiled"][..]] {
        let mut args = vec!["ping", "10.0.0.3", "-c", "3", "-i", "0.1", "-W", "2"];
        args.extend_from_slice(extra);
        let out = net.run(1, &args);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}:\n{stdout}{}", text(&out.stderr));
        for seq in 1..=3 {
            let l = format!(" bytes from 10.0.0.3: seq={seq} time=");
            assert!(stdout.lines().any(|x| x.contains(&l) && x.ends_with(" ms")), "no reply {seq}:\n{stdout}");
        }
        assert!(stdout.contains("\n--- 10.0.0.3 snap ping statistics ---\n"), "{stdout}");
        assert!(stdout.contains("\n3 packets transmitted, 3 received, 0% packet loss\n"), "{stdout}");
        let rtt = stdout.lines().find_map(|l| l.strip_prefix("rtt min/avg/max/mdev = ")).expect("rtt line");
        let v: Vec<f64> = rtt.strip_suffix(" ms").expect("ms").split('/').map(|x| x.parse().expect("number")).collect();
        assert_eq!(v.len(), 4);
        assert!(v[0] <= v[1] && v[1] <= v[2], "{rtt}");
    }
}

#[test]
fn ping_without_replies_fails() {
    let net = Line::start();
    // No route anywhere from 10.0.0.2 to 10.0.0.9: nothing comes back.
    let out = net.run(2, &["ping", "10.0.0.9", "-c", "1", "-W", "0.3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("1 packets transmitted, 0 received, 100% packet loss"));
}

#[test]
fn traceroute_lists_each_hop() {
    let net = Line::start();
    let out = net.run(1, &["traceroute", "10.0.0.3", "-W", "3"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let hops: Vec<(u32, String)> = stdout
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.get(3), Some(&"ms"), "{l}");
            (f[0].parse().expect("hop"), f[1].to_owned())
        })
        .collect();
    assert_eq!(hops, vec![(1, "10.0.0.2".to_owned()), (2, "10.0.0.3".to_owned())], "{stdout}");
}

#[test]
fn send_and_recv_a_file_over_two_hops() {
    let net = Line::start();
    let data: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let input = net.dir.join("in.bin");
    let output = net.dir.join("out.bin");
    std::fs::write(&input, &data).expect("input");
    // 5000 bytes in chunks of 1356 (MTU 1400 less 44 bytes of program): 4.
    let out_s = output.to_string_lossy().into_owned();
    let rx = net.recv(3, &["9000", "--count", "4", "--timeout", "5", "-o", &out_s]);
    let out = net.run(1, &["send", "10.0.0.3", "9000", &input.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("5000 bytes in 4 packets"), "{}", text(&out.stderr));
    let (code, _, err) = rx.finish();
    assert_eq!(code, Some(0), "recv: {err}");
    assert!(err.contains("5000 bytes in 4 packets"), "{err}");
    assert!(std::fs::read(&output).expect("output") == data, "file changed in transit");
}

#[test]
fn multicast_reaches_each_listed_host_once() {
    let net = Line::start();
    let msg = "hello, listed hosts";
    let rx: Vec<Proc> = (1..=3).map(|i| net.recv(i, &["7100", "--timeout", "0.7"])).collect();
    let out = net.run(1, &["multicast", "--to", "10.0.0.2,10.0.0.3", "--port", "7100", msg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got: Vec<String> = rx.into_iter().map(|p| text(&p.finish().1)).collect();
    assert_eq!(got, vec![String::new(), msg.to_owned(), msg.to_owned()], "unlisted 10.0.0.1 gets nothing");
    // 10.0.0.1 has one interface: it cannot keep a copy and move on.
    let out = net.run(1, &["multicast", "--to", "10.0.0.1,10.0.0.3", msg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("too_many_sends"), "{}", text(&out.stderr));
}

#[test]
fn missing_node_is_explained() {
    let dir = Path::new("/nonexistent/anode-run");
    let out = Command::new(ANODE).args(["ping", "10.0.0.3", "--run-dir"]).arg(dir).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("is `anode node` running? no socket at /nonexistent/anode-run/app.sock"), "{err}");
}
