//! `fnrun-loadgen`: calls `RunFunction` (or, with `--api evaluate`, Porch's
//! `EvaluateFunction`) on one of the daemon's listeners (a unix socket, an
//! abstract one, TCP or TLS) `N` times at each concurrency `C`
//! and prints p50/p90/p99/max latency, throughput and errors, as a table
//! (stderr) and as JSON (stdout or `--json FILE`). A call counts as ok when
//! its output is as long as its input (the bench's function is `cat`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use fnrun_api::evaluator::EvaluateFunctionRequest;
use fnrun_api::evaluator::function_evaluator_client::FunctionEvaluatorClient;
use fnrun_api::v1alpha1::RunFunctionRequest;
use fnrun_api::v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient;
use serde_json::json;
use tonic::transport::Channel;

/// Which API the calls go to.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Api {
    /// `apiextensions.fn.proto.v1alpha1` `RunFunction` (FunctionIO).
    RunFunction,
    /// Porch's `evaluator.FunctionEvaluator/EvaluateFunction` (ResourceList).
    Evaluate,
}

/// A client of the API under test.
#[derive(Clone)]
enum Client {
    RunFunction(ContainerizedFunctionRunnerServiceClient<Channel>),
    Evaluate(FunctionEvaluatorClient<Channel>),
}

impl Client {
    /// One call, with `grpc-timeout` `deadline` if any; the length of its
    /// output.
    async fn call(
        &mut self,
        image: &str,
        input: &[u8],
        deadline: Option<Duration>,
    ) -> Result<usize, tonic::Status> {
        fn request<T>(message: T, deadline: Option<Duration>) -> tonic::Request<T> {
            let mut request = tonic::Request::new(message);
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            request
        }
        match self {
            Client::RunFunction(c) => c
                .run_function(request(
                    RunFunctionRequest {
                        image: image.to_owned(),
                        input: input.to_vec(),
                        ..Default::default()
                    },
                    deadline,
                ))
                .await
                .map(|r| r.get_ref().output.len()),
            Client::Evaluate(c) => c
                .evaluate_function(request(
                    EvaluateFunctionRequest {
                        resource_list: input.to_vec(),
                        image: image.to_owned(),
                        tag: String::new(),
                    },
                    deadline,
                ))
                .await
                .map(|r| r.get_ref().resource_list.len()),
        }
    }
}

#[derive(Debug, Parser)]
#[command(about = "RunFunction load client for fnrun benchmarks")]
struct Args {
    /// The daemon's unix socket (as `--target unix:PATH`).
    #[arg(long, conflicts_with = "target", required_unless_present = "target")]
    socket: Option<PathBuf>,
    /// The daemon's listener: unix:PATH, unix-abstract:NAME or HOST:PORT
    /// (h2c; TLS with `--ca`).
    #[arg(long, value_name = "ADDR")]
    target: Option<String>,
    /// Speak TLS to HOST:PORT, verifying the server's certificate with this
    /// CA (PEM) and `--server-name`.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// The name the server's certificate must have (with `--ca`).
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// The function image (as the daemon resolves it, e.g. oci:/path:tag).
    #[arg(long)]
    image: String,
    /// Input FunctionIO file (default: a minimal document).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Calls per concurrency level.
    #[arg(short = 'n', long, default_value_t = 500)]
    requests: usize,
    /// Concurrency levels, comma separated (e.g. 1,2,4,8).
    #[arg(short = 'c', long, value_delimiter = ',', default_value = "1")]
    concurrency: Vec<usize>,
    /// Unmeasured calls before each level.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Hard limit on the wall time of one level (the run stops early, and
    /// the remaining calls count as not made).
    #[arg(long, default_value = "600")]
    max_seconds: u64,
    /// Per-call timeout.
    #[arg(long, default_value = "30")]
    call_timeout: u64,
    /// Send each call's deadline (`grpc-timeout`) of this many seconds, as
    /// Crossplane and Porch do.
    #[arg(long)]
    deadline: Option<u64>,
    /// Each worker waits this many milliseconds after each of its calls: a
    /// call rate below the machine's, so that what the daemon does after a
    /// call (a pooled sandbox's refill, a run's end) is done before the
    /// next one, as between a reconcile loop's calls. 0: back to back.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
    /// Also write the raw latencies (ms) of each level into the JSON.
    #[arg(long)]
    raw: bool,
    /// Label for the JSON (e.g. "fnrun").
    #[arg(long, default_value = "fnrun")]
    label: String,
    /// Write JSON here instead of stdout.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Fail (exit 1) if any call failed.
    #[arg(long)]
    require_zero_errors: bool,
    /// The API to call.
    #[arg(long, value_enum, default_value_t = Api::RunFunction)]
    api: Api,
}

/// A channel to the listener `args` name.
async fn channel(args: &Args) -> Result<Channel> {
    use fnrun_tests::client;
    let target = match (&args.socket, &args.target) {
        (Some(path), _) => return client::channel_unix(path).await,
        (None, Some(target)) => target,
        (None, None) => bail!("give --target or --socket"),
    };
    if let Some(path) = target.strip_prefix("unix:") {
        return client::channel_unix(std::path::Path::new(path)).await;
    }
    if let Some(name) = target.strip_prefix("unix-abstract:") {
        return client::channel_abstract(name).await;
    }
    client::channel_tcp(
        target,
        args.ca.as_deref().map(|ca| (ca, args.server_name.as_str())),
    )
    .await
}

async fn connect(args: &Args) -> Result<Client> {
    let channel = channel(args).await?;
    Ok(match args.api {
        Api::RunFunction => Client::RunFunction(
            ContainerizedFunctionRunnerServiceClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        ),
        Api::Evaluate => Client::Evaluate(
            FunctionEvaluatorClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        ),
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest-rank.
    // A rank between 0 and the length (p is a percentage): the float to
    // integer conversion saturates and cannot lose anything that matters.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct Level {
    concurrency: usize,
    latencies_ms: Vec<f64>,
    errors: usize,
    first_error: Option<String>,
    wall: Duration,
}

async fn run_level(args: &Args, input: &Arc<Vec<u8>>, c: usize) -> Result<Level> {
    // One connection per worker: no HTTP/2 stream sharing between workers.
    let mut clients = Vec::with_capacity(c);
    for _ in 0..c {
        clients.push(connect(args).await?);
    }
    let timeout = Duration::from_secs(args.call_timeout);
    let grpc_deadline = args.deadline.map(Duration::from_secs);
    // Warm-up on the first connection (pull/unpack already done by the caller).
    for _ in 0..args.warmup {
        let r =
            tokio::time::timeout(timeout, clients[0].call(&args.image, input, grpc_deadline)).await;
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(s)) => bail!("warm-up call failed: {s}"),
            Err(_) => bail!("warm-up call timed out"),
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(c);
    for mut client in clients {
        let next = Arc::clone(&next);
        let (image, input) = (args.image.clone(), Arc::clone(input));
        let n = args.requests;
        let pause = Duration::from_millis(args.pause_ms);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0usize;
            let mut first_error = None;
            while next.fetch_add(1, Ordering::Relaxed) < n && Instant::now() < deadline {
                let t = Instant::now();
                let r =
                    tokio::time::timeout(timeout, client.call(&image, &input, grpc_deadline)).await;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                match r {
                    Ok(Ok(len)) if len == input.len() => {
                        lat.push(ms);
                    }
                    Ok(Ok(len)) => {
                        errors += 1;
                        first_error
                            .get_or_insert_with(|| format!("unexpected output of {len} bytes"));
                    }
                    Ok(Err(s)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| s.to_string());
                    }
                    Err(_) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| "client timeout".to_owned());
                    }
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            (lat, errors, first_error)
        }));
    }
    let mut level = Level {
        concurrency: c,
        latencies_ms: Vec::with_capacity(args.requests),
        errors: 0,
        first_error: None,
        wall: Duration::ZERO,
    };
    for t in tasks {
        let (lat, errors, first_error) = t.await?;
        level.latencies_ms.extend(lat);
        level.errors += errors;
        if level.first_error.is_none() {
            level.first_error = first_error;
        }
    }
    level.wall = start.elapsed();
    level.latencies_ms.sort_by(f64::total_cmp);
    Ok(level)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let input = match &args.input {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        None => b"observed: {}\ndesired: {}\n".to_vec(),
    };
    let input = Arc::new(input);
    // Two worker threads: the machine under test has two cores; the client
    // should not take more than its share.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut levels = Vec::new();
    for &c in &args.concurrency {
        levels.push(rt.block_on(run_level(&args, &input, c.max(1)))?);
    }

    eprintln!(
        "{:<10} {:>4} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "label",
        "conc",
        "calls",
        "errors",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "mean ms",
        "runs/s"
    );
    let mut out = Vec::new();
    let mut any_error = false;
    for l in &levels {
        let ok = l.latencies_ms.len();
        let total = ok + l.errors;
        let rps = total as f64 / l.wall.as_secs_f64();
        let mean = l.latencies_ms.iter().sum::<f64>() / ok.max(1) as f64;
        let (p50, p90, p99, max) = (
            percentile(&l.latencies_ms, 50.0),
            percentile(&l.latencies_ms, 90.0),
            percentile(&l.latencies_ms, 99.0),
            l.latencies_ms.last().copied().unwrap_or(f64::NAN),
        );
        eprintln!(
            "{:<10} {:>4} {:>6} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1}",
            args.label, l.concurrency, total, l.errors, p50, p90, p99, max, mean, rps
        );
        if let Some(e) = &l.first_error {
            eprintln!("  first error: {e}");
        }
        any_error |= l.errors > 0;
        let mut v = json!({
            "label": args.label,
            "concurrency": l.concurrency,
            "calls": total,
            "ok": ok,
            "errors": l.errors,
            "first_error": l.first_error,
            "wall_s": l.wall.as_secs_f64(),
            "throughput_per_s": rps,
            "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "max_ms": max, "mean_ms": mean,
        });
        if args.raw {
            v["latencies_ms"] = json!(l.latencies_ms);
        }
        out.push(v);
    }
    let doc = serde_json::to_string_pretty(&json!({ "levels": out }))?;
    match &args.json {
        Some(path) => std::fs::write(path, doc + "\n")?,
        None => println!("{doc}"),
    }
    if args.require_zero_errors && any_error {
        bail!("some calls failed");
    }
    Ok(())
}
