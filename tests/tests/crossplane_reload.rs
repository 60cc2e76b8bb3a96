//! SIGHUP reloads the functions file without dropping a call in flight: a
//! changed function is replaced (new calls reach the new definition, the old
//! instance finishes its calls and stops), a removed one stops once its last
//! call ends, an added one gets its certificate and is served, an unchanged
//! one keeps its warm instance, and a file that cannot be used changes
//! nothing.

use std::time::Duration;

use fnrun_tests::crossplane::{GoFunction, Outcome, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, alive};
use fnrun_tests::user::require_root;

fn label(outcome: &Outcome) -> String {
    assert!(outcome.is_ok(), "{outcome:?}");
    outcome.desired_resource("instance").expect("instance")["metadata"]["labels"]["fnrun.dev/by"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn sighup_replaces_removes_and_adds_functions_without_dropping_calls() {
    if !require_root("sighup_replaces_removes_and_adds_functions_without_dropping_calls") {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let image = image.oci_ref();
    let a_v1 =
        Entry::new("fn-a", &image).set("args", vec!["--label=fnrun.dev/by=a-v1", "--delay=3s"]);
    let b = Entry::new("fn-b", &image).set("args", vec!["--label=fnrun.dev/by=b", "--delay=3s"]);
    let d = Entry::new("fn-d", &image).set("args", vec!["--label=fnrun.dev/by=d"]);
    let host = FunctionHost::start(HostOpts::insecure(vec![a_v1, b, d.clone()]).tls(HostTls::Mint))
        .unwrap();
    // Warm fn-d: it is kept as it is.
    assert_eq!(
        label(&host.call("fn-d").request(SAMPLE_REQUEST).run().unwrap()),
        "d"
    );
    let d_pid = host.server_pids("fn-d")[0];

    // Slow calls to fn-a and fn-b are in flight during the reload.
    let in_flight: Vec<_> = ["fn-a", "fn-b"]
        .iter()
        .map(|name| {
            let call = host.call(name).request(SAMPLE_REQUEST);
            std::thread::spawn(move || call.run().unwrap())
        })
        .collect();
    host.wait_log("function server ready", 3, Duration::from_secs(20))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let a_old = host.server_pids("fn-a")[0];
    let b_pid = host.server_pids("fn-b")[0];

    let a_v2 = Entry::new("fn-a", &image).set("args", vec!["--label=fnrun.dev/by=a-v2"]);
    let c = Entry::new("fn-c", &image).set("args", vec!["--label=fnrun.dev/by=c"]);
    host.reload(&[a_v2, c, d]).unwrap();
    let log = host.log();
    assert!(
        log.contains(
            "functions reloaded added=[\"fn-c\"] replaced=[\"fn-a\"] removed=[\"fn-b\"] kept=1"
        ),
        "{log}"
    );

    // New calls: fn-a's new definition, fn-c, fn-d's same server; fn-b is gone.
    assert_eq!(
        label(&host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap()),
        "a-v2"
    );
    assert_eq!(
        label(&host.call("fn-c").request(SAMPLE_REQUEST).run().unwrap()),
        "c"
    );
    assert_eq!(
        label(&host.call("fn-d").request(SAMPLE_REQUEST).run().unwrap()),
        "d"
    );
    assert_eq!(host.server_pids("fn-d"), [d_pid]);
    // fn-b's certificate went with it: fnrun holds the CA key, so its name
    // gets one minted for it, and the call NOT_FOUND with what exists.
    let outcome = host.call("fn-b").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
    assert!(outcome.message.contains("fn-a, fn-c, fn-d"), "{outcome:?}");

    // The calls in flight were answered by the definitions they started on.
    let answers: Vec<String> = in_flight
        .into_iter()
        .map(|t| label(&t.join().unwrap()))
        .collect();
    assert_eq!(answers, ["a-v1", "b"]);
    // Then the old instances stopped.
    host.wait_log("function server stopped", 2, Duration::from_secs(10))
        .unwrap();
    assert!(!alive(a_old), "fn-a's old server outlived its last call");
    assert!(!alive(b_pid), "fn-b's server outlived its last call");
    let a_pids = host.server_pids("fn-a");
    assert_eq!(a_pids.len(), 2);
    assert!(alive(a_pids[1]));
    assert!(alive(d_pid));
}

#[test]
fn a_functions_file_that_cannot_be_used_changes_nothing() {
    if !require_root("a_functions_file_that_cannot_be_used_changes_nothing") {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(HostOpts::insecure(vec![Entry::new(
        "fn-a",
        &image.oci_ref(),
    )]))
    .unwrap();
    assert!(
        host.call("fn-a")
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap()
            .is_ok()
    );
    let pid = host.server_pids("fn-a")[0];
    for (bad, wanted) in [
        (
            "functions:\n- {name: fn-a, image: x, imagePullpolicy: Never}\n".to_owned(),
            "unknown field `imagePullpolicy`",
        ),
        ("functions: [\n".to_owned(), "is not valid"),
        (
            "functions:\n- {name: fn-a, image: x}\n- {name: fn-a, image: y}\n".to_owned(),
            "function \"fn-a\" is defined twice",
        ),
        (
            format!(
                "functions:\n- {{name: {}, image: x}}\n",
                "x".repeat(100_000)
            ),
            "is not a DNS label",
        ),
    ] {
        host.reload_raw(bad.as_bytes()).unwrap();
        let log = host.log();
        let line = log
            .lines()
            .rfind(|l| l.contains("functions not reloaded"))
            .expect("the refusal is logged");
        assert!(line.contains(wanted), "{line}");
        assert!(line.len() < 5000, "{} bytes", line.len());
        // Still served, by the same server.
        assert!(
            host.call("fn-a")
                .request(SAMPLE_REQUEST)
                .run()
                .unwrap()
                .is_ok()
        );
        assert_eq!(host.server_pids("fn-a"), [pid]);
    }
    // A missing file too.
    std::fs::remove_file(host.functions_file()).unwrap();
    host.daemon().signal(nix::sys::signal::Signal::SIGHUP);
    host.wait_log("functions not reloaded", 5, Duration::from_secs(10))
        .unwrap();
    assert!(
        host.call("fn-a")
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap()
            .is_ok()
    );
}

#[test]
fn a_changed_file_is_applied_without_sighup() {
    if !require_root("a_changed_file_is_applied_without_sighup") {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(
        HostOpts::insecure(vec![Entry::new("fn-a", &image.oci_ref())])
            .arg("--functions-check-interval")
            .arg("300ms"),
    )
    .unwrap();
    // As a mounted ConfigMap changes: a new file swapped in.
    let tmp = host.functions_file().with_extension("tmp");
    std::fs::write(
        &tmp,
        fnrun_tests::function_host::functions_yaml(&[
            Entry::new("fn-a", &image.oci_ref()),
            Entry::new("fn-b", &image.oci_ref()),
        ]),
    )
    .unwrap();
    std::fs::rename(&tmp, host.functions_file()).unwrap();
    let log = host
        .wait_log("the functions file changed", 1, Duration::from_secs(10))
        .unwrap();
    assert!(!log.contains("SIGHUP"), "{log}");
    host.wait_log("functions reloaded", 1, Duration::from_secs(10))
        .unwrap();
    assert!(
        host.call("fn-b")
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap()
            .is_ok()
    );
    // Unchanged since: no more reloads.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(host.log().matches("functions reloaded").count(), 1);
}
