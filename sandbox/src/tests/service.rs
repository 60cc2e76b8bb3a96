//! Service runs on real namespaces: started, reached through connections
//! opened inside their network namespace, watched, stopped, and cleaned up,
//! alone and alongside per-call runs, as root and rootless.

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::{Service, ServiceExit};

/// A port that is free on the host: the services' own is not published, so
/// the host must not answer on it.
fn service_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

/// busybox's `nc` as a persistent echo server on `port`.
fn echo_server(fx: &Fixture, port: u16) -> RunSpec {
    fx.spec(&format!(
        "echo listening on {port}; exec nc -ll -p {port} -e cat"
    ))
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A connection to the service's `port`, once it listens.
async fn connect_when_ready(service: &Service, port: u16) -> tokio::net::TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match service.connect(local(port)).await {
            Ok(stream) => return stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                assert!(Instant::now() < deadline, "the service never listened");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("cannot connect to the service: {e}"),
        }
    }
}

/// Sends `line` and reads the echo.
async fn echo(stream: tokio::net::TcpStream, line: &str) -> String {
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await.unwrap();
    answer.trim_end().to_owned()
}

fn alive(pid: libc::pid_t) -> bool {
    proc_status(pid, "State").is_some_and(|s| !s.starts_with('Z'))
}

/// Init's parent-death signal is tied to the thread that cloned it, not
/// the process. Without the spawner, a service started from a thread that
/// then ends (as a tokio blocking thread ends after 10 s idle) must keep
/// running: the direct launcher clones every init on a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_spawner_a_service_outlives_the_thread_that_started_it() {
    let fx = Fixture::with(|c| c.spawner = false);
    let port = service_port();
    let spec = echo_server(&fx, port);
    let runtime = tokio::runtime::Handle::current();
    let service = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _entered = runtime.enter();
                fx.sandbox.start_service(&spec)
            })
            .join()
            .expect("the starting thread does not panic")
    })
    .unwrap();
    // The thread that started it has ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(exit) = service.try_exit() {
        panic!("the service ended with the thread that started it: {exit:?}");
    }
    assert!(alive(service.pid()));
    let stream = connect_when_ready(&service, port).await;
    assert_eq!(echo(stream, "still here").await, "still here");
    let exit = service.stop().await;
    assert!(exit.stopped, "{exit:?}");
}

#[tokio::test]
async fn a_service_is_reached_inside_its_network_namespace_and_stopped() {
    let fx = Fixture::new();
    let port = service_port();
    let service = fx.sandbox.start_service(&echo_server(&fx, port)).unwrap();
    let init = service.pid();
    assert!(alive(init));
    let stream = connect_when_ready(&service, port).await;
    assert_eq!(echo(stream, "hello").await, "hello");
    // Two connections at once, each its own.
    let (a, b) = tokio::join!(
        connect_when_ready(&service, port),
        connect_when_ready(&service, port)
    );
    let (a, b) = tokio::join!(echo(a, "one"), echo(b, "two"));
    assert_eq!((a.as_str(), b.as_str()), ("one", "two"));
    // Nothing listens on the host: the port lives in the run's namespace.
    let refused = std::net::TcpStream::connect(local(port)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(service.try_exit().map(|e| e.stopped), None);
    assert!(
        text(&service.output_tail()).contains(&format!("listening on {port}")),
        "{}",
        text(&service.output_tail())
    );

    let exit = service.stop().await;
    assert!(exit.stopped, "{exit:?}");
    assert_eq!(exit.status.unwrap(), Status::Signaled(libc::SIGKILL));
    assert!(!alive(init), "init {init} outlived the stop");
    // The fixture's drop checks that no process is left in the run's cgroups
    // and that they go with the sandbox.
}

#[tokio::test]
async fn a_service_that_exits_reports_it_with_its_output() {
    let fx = Fixture::new();
    let spec = fx.spec("echo starting; echo oops >&2; exit 3");
    let service = fx.sandbox.start_service(&spec).unwrap();
    let exit = tokio::time::timeout(TIMEOUT, service.exited())
        .await
        .expect("the exit is reported");
    assert!(!exit.stopped);
    assert_eq!(exit.status.unwrap(), Status::Exited(3));
    assert_eq!(text(&exit.output_tail), "starting\noops\n");
    // Its namespace is gone with it: no connection can be opened there.
    let err = service.connect(local(9443)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotConnected, "{err}");
    assert!(service.try_exit().is_some());
}

#[tokio::test]
async fn a_service_that_cannot_start_says_why() {
    let fx = Fixture::new();
    let mut spec = fx.spec("true");
    spec.argv = vec!["/no/such/server".into()];
    let service = fx.sandbox.start_service(&spec).unwrap();
    let exit = service.exited().await;
    let err = exit.status.unwrap_err();
    assert!(
        matches!(
            *err,
            Error::Exec {
                errno: nix::errno::Errno::ENOENT,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_service_past_its_memory_limit_is_out_of_memory() {
    let fx = Fixture::new();
    if !fx.sandbox.limit_support().memory.is_available() {
        eprintln!("skipped: no memory limit on this host");
        return;
    }
    // One endless line: tail's buffer grows until the limit stops it.
    let mut spec = fx.spec("exec tail /dev/zero");
    spec.limits.memory_bytes = Some(16 << 20);
    let service = fx.sandbox.start_service(&spec).unwrap();
    let exit = tokio::time::timeout(TIMEOUT, service.exited())
        .await
        .expect("the OOM kill ends it");
    assert_eq!(exit.status.unwrap(), Status::OutOfMemory);
}

#[tokio::test]
async fn dropping_a_service_stops_it_and_leaves_nothing() {
    let fx = Fixture::new();
    let port = service_port();
    let service = fx.sandbox.start_service(&echo_server(&fx, port)).unwrap();
    let init = service.pid();
    let stream = connect_when_ready(&service, port).await;
    let watch = service.exit_watch();
    assert!(watch.try_exit().is_none());
    drop(service);
    // The watch outlives the service and sees its end, cleaned up.
    let exit = tokio::time::timeout(Duration::from_secs(10), watch.clone().exited())
        .await
        .expect("the end of a dropped service is reported");
    assert!(exit.stopped, "{exit:?}");
    assert_eq!(exit.status.unwrap(), Status::Signaled(libc::SIGKILL));
    assert!(watch.try_exit().is_some());
    assert!(!alive(init), "init {init} outlived its service");
    // The open connection sees the end of its server.
    let mut line = String::new();
    let (read, _write) = stream.into_split();
    let n = BufReader::new(read).read_line(&mut line).await.unwrap_or(0);
    assert_eq!(n, 0);
    // The fixture's drop checks that no cgroup of the run is left.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_service_runs_alongside_per_call_runs() {
    let fx = Arc::new(Fixture::new());
    let services: Vec<(u16, Service)> = (0..6)
        .map(|_| {
            let port = service_port();
            (
                port,
                fx.sandbox.start_service(&echo_server(&fx, port)).unwrap(),
            )
        })
        .collect();
    let calls = (0..24).map(|i| {
        let fx = fx.clone();
        tokio::spawn(async move {
            let out = fx
                .sandbox
                .run(&fx.spec("cat"), format!("call {i}").as_bytes(), TIMEOUT)
                .await
                .unwrap();
            assert_eq!(text(&out.stdout), format!("call {i}"));
        })
    });
    let echoes = services
        .iter()
        .enumerate()
        .map(|(i, (port, service))| async move {
            for round in 0..3 {
                let stream = connect_when_ready(service, *port).await;
                assert_eq!(
                    echo(stream, &format!("service {i} round {round}")).await,
                    format!("service {i} round {round}")
                );
            }
        });
    let (calls, ()) = tokio::join!(futures_join_all(calls), async {
        for e in echoes {
            e.await;
        }
    });
    for c in calls {
        c.unwrap();
    }
    let inits: Vec<_> = services.iter().map(|(_, s)| s.pid()).collect();
    let mut exits: Vec<ServiceExit> = Vec::new();
    for (_, service) in services {
        exits.push(service.stop().await);
    }
    assert!(exits.iter().all(|e| e.stopped));
    assert!(inits.iter().all(|&p| !alive(p)));
}

/// Awaits every handle (the crate has no `futures` dependency).
async fn futures_join_all<T>(
    handles: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await);
    }
    out
}

/// Set in the child process of the rootless test.
const ROOTLESS_CHILD: &str = "FNRUN_SANDBOX_TEST_ROOTLESS_CHILD";

/// A rootless runner cannot enter the run's network namespace (that needs
/// CAP_SYS_ADMIN in its own user namespace too): the sockets init hands out
/// are how it connects. It makes sandboxes ahead too, for a call and for a
/// service. The test runs this test binary again as `nobody` (uid 65534),
/// where it takes the child's part.
#[test]
fn service_runs_work_for_a_rootless_runner() {
    if let Some(all) = super::rootless_part(
        "tests::service::service_runs_work_for_a_rootless_runner",
        ROOTLESS_CHILD,
        rootless_child,
    ) {
        assert!(all.contains("rootless service echoed"), "{all}");
        assert!(all.contains("rootless prepared runs served"), "{all}");
    }
}

fn rootless_child() {
    assert_ne!(nix::unistd::geteuid().as_raw(), 0);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let fx = Fixture::new();
            assert!(
                matches!(fx.sandbox.config().id_map, IdMap::Own { .. }),
                "{:?}",
                fx.sandbox.config().id_map
            );
            let port = service_port();
            let service = fx.sandbox.start_service(&echo_server(&fx, port)).unwrap();
            let stream = connect_when_ready(&service, port).await;
            assert_eq!(echo(stream, "rootless").await, "rootless");
            let out = fx.sh("id -u").await;
            assert_eq!(text(&out.stdout), "0\n");
            let init = service.pid();
            let exit = service.stop().await;
            assert!(exit.stopped);
            assert!(!alive(init));
            println!("rootless service echoed");

            // Made ahead, as the runner's pool and the function host's
            // spares make them, by a rootless runner.
            let mut prepared = fx.sandbox.prepare(&fx.spec("cat; id -u")).unwrap();
            prepared.ready().await.unwrap();
            assert!(
                prepared.memory_bytes().is_some_and(|b| b > 0),
                "a rootless runner reads its prepared sandbox's memory too"
            );
            let out = fx
                .sandbox
                .run_prepared(prepared, b"in\n", TIMEOUT)
                .await
                .unwrap();
            assert_eq!(text(&out.stdout), "in\n0\n", "{}", text(&out.stderr_tail));
            let mut prepared = fx.sandbox.prepare_service(&echo_server(&fx, port)).unwrap();
            prepared.ready().await.unwrap();
            let service = fx.sandbox.start_prepared_service(prepared).unwrap();
            let stream = connect_when_ready(&service, port).await;
            assert_eq!(echo(stream, "prepared").await, "prepared");
            let init = service.pid();
            assert!(service.stop().await.stopped);
            assert!(!alive(init));
            println!("rootless prepared runs served");
        });
}

#[tokio::test]
async fn a_prepared_service_starts_when_asked_confined_as_any_run() {
    let fx = Fixture::new();
    let port = service_port();
    let spec = fx.spec(&format!(
        "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
         echo listening on {port}; exec nc -ll -p {port} -e cat"
    ));
    let mut prepared = fx.sandbox.prepare_service(&spec).unwrap();
    prepared.ready().await.unwrap();
    let init = prepared.pid();
    // Nothing of the server's code runs before its start: init, alive, has
    // one child waiting at its exec without privileges.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(init));
    let server = function_at_its_exec(init);
    let made = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;

    let service = fx.sandbox.start_prepared_service(prepared).unwrap();
    assert_eq!(service.pid(), init);
    let stream = connect_when_ready(&service, port).await;
    assert_eq!(echo(stream, "hello").await, "hello");
    // The process that waited is the server.
    let cmdline = std::fs::read(format!("/proc/{server}/cmdline")).unwrap();
    assert!(cmdline.starts_with(b"nc\0"), "{}", text(&cmdline));
    let out = text(&service.output_tail());
    for (key, value) in [
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ] {
        assert_eq!(status_fields(&out, &[key]), [(key, value)], "{out}");
    }
    let exit = service.stop().await;
    assert!(exit.stopped, "{exit:?}");
    // Its time counts from its start, not from its sandbox's making.
    assert!(exit.elapsed < made.elapsed(), "{exit:?}");
    assert!(!alive(init), "init {init} outlived the stop");

    // Dropped unused, it leaves nothing (the fixture's drop checks the
    // cgroups).
    let mut prepared = fx.sandbox.prepare_service(&spec).unwrap();
    prepared.ready().await.unwrap();
    let init = prepared.pid();
    drop(prepared);
    assert!(!alive(init), "init {init} outlived its prepared service");

    // One whose init died meanwhile ends at once when started, and says so.
    let mut prepared = fx.sandbox.prepare_service(&spec).unwrap();
    prepared.ready().await.unwrap();
    super::prepared::kill_init(&prepared).await;
    let service = fx.sandbox.start_prepared_service(prepared).unwrap();
    let exit = tokio::time::timeout(TIMEOUT, service.exited())
        .await
        .expect("a service of a dead init ends at once");
    assert!(!exit.stopped, "{exit:?}");
    assert!(!matches!(exit.status, Ok(Status::Exited(0))), "{exit:?}");
}
