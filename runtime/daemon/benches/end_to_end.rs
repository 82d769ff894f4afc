//! B9: flowd end to end. Runs of B1's workflow (ten recipe steps, 1 KB of
//! input; `flow_tests::bench::ten_steps_source`) started through
//! `POST /v1/runs` by concurrent clients, measured until every run has
//! completed: steps per second, and where the CPU went.
//!
//! flowd runs as processes of their own (the release binary, the offline
//! provider: no model latency), on SQLite (full durability) or on the
//! PostgreSQL server on 127.0.0.1:5432 (`FLOW_TEST_POSTGRES_URL`), in a
//! schema of its own dropped after. With `--flowds N` (PostgreSQL only),
//! N flowds share the schema, as flowds on several machines would, and the
//! starts go to each in turn. This process is the load generator.
//!
//! Each row gives the CPU time of flowd's threads by name (tokio's workers
//! serve HTTP and drive runs; SQLite's journal writer is a thread of its
//! own), of this process and of PostgreSQL's processes, per step; with
//! PostgreSQL, a second line gives what the database wrote per step.
//! `bench/profile b9` splits flowd's CPU by what the code was doing.
//!
//! `cargo bench -p flow-daemon --bench end_to_end -- [--quick]
//!  [--store sqlite|postgres] [--flowds 1,2,3] [--runs N] [--clients N]`

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Flowd, config, post_json};
use flow_tests::bench::{cpu_between, cpu_by_thread, cpu_of_processes, profiler, ten_steps_source};
use flow_tests::postgres::TestSchema;
use serde_json::json;

const KEY: &str = "bench-key-0123456789";

/// The runs B1 has in flight at once.
const B1_RUNS: usize = 1_000;

/// What one measurement is given.
struct Load {
    runs: usize,
    clients: usize,
    flowds: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let quick = args.iter().any(|a| a == "--quick");
    let runs = value("--runs").map_or(if quick { 100 } else { 3_000 }, |n| {
        n.parse().expect("--runs N")
    });
    let clients = value("--clients").map_or(64, |n| n.parse().expect("--clients N"));
    let stores: Vec<String> = value("--store").map_or_else(
        || vec!["sqlite".to_string(), "postgres".to_string()],
        |s| vec![s],
    );
    let flowds: Vec<usize> = value("--flowds").map_or(vec![1], |list| {
        list.split(',')
            .map(|n| n.parse().expect("--flowds 1,2,3"))
            .collect()
    });
    for store in &stores {
        for &flowds in &flowds {
            let load = Load {
                runs,
                clients,
                flowds,
            };
            match store.as_str() {
                "sqlite" => {
                    assert_eq!(flowds, 1, "flowds share a PostgreSQL store only");
                    sqlite(&load);
                }
                "postgres" => postgres(&load),
                other => panic!("--store sqlite|postgres, not {other}"),
            }
        }
    }
}

fn sqlite(load: &Load) {
    let dir = std::env::temp_dir().join(format!("flow-bench-b9-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db = dir.join("flowd.db").display().to_string();
    let measured = measure(load, &db, std::slice::from_ref(&dir));
    println!(
        "{}",
        measured.row("SQLite full durability (WAL, synchronous=FULL)", load)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn postgres(load: &Load) {
    let schema = TestSchema::new();
    let dirs: Vec<_> = (0..load.flowds)
        .map(|i| {
            let dir = std::env::temp_dir().join(format!(
                "flow-bench-b9-{}-{}-{i}",
                std::process::id(),
                schema.name()
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            dir
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let before = runtime.block_on(Written::read(schema.name()));
    let measured = measure(load, &schema.url(), &dirs);
    // flowd has stopped: its connections' statistics reach the server's
    // counters as they close, a moment after.
    std::thread::sleep(Duration::from_millis(500));
    let after = runtime.block_on(Written::read(schema.name()));
    println!(
        "{}",
        measured.row("PostgreSQL (synchronous_commit=on)", load)
    );
    println!("{}", after.since(&before).per_step((load.runs * 10) as f64));
    for dir in dirs {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What a measurement found.
struct Measured {
    elapsed: Duration,
    /// Every flowd's threads, summed by name.
    flowd: BTreeMap<String, Duration>,
    generator: Duration,
    postgres: Duration,
}

impl Measured {
    fn row(&self, store: &str, load: &Load) -> String {
        let steps = (load.runs * 10) as f64;
        let seconds = self.elapsed.as_secs_f64();
        let flowd: Duration = self.flowd.values().sum();
        let threads: Vec<String> = self
            .flowd
            .iter()
            .filter(|(_, time)| time.as_secs_f64() / seconds >= 0.005)
            .map(|(name, time)| format!("{name} {:.2}", time.as_secs_f64() / seconds))
            .collect();
        let per_step = |time: Duration| time.as_secs_f64() * 1e6 / steps;
        format!(
            "| B9 | {} runs x 10 steps started over HTTP by {} clients, {store}, {} flowd{} | {steps} steps in {seconds:.3} s | {:.0} steps/s | cores busy: flowd {:.2} ({}), load generator {:.2}, PostgreSQL {:.2}; CPU per step: flowd {:.1} µs, load generator {:.1} µs, PostgreSQL {:.1} µs |",
            load.runs,
            load.clients,
            load.flowds,
            if load.flowds == 1 { "" } else { "s" },
            steps / seconds,
            flowd.as_secs_f64() / seconds,
            threads.join(", "),
            self.generator.as_secs_f64() / seconds,
            self.postgres.as_secs_f64() / seconds,
            per_step(flowd),
            per_step(self.generator),
            per_step(self.postgres),
        )
    }
}

/// Starts one flowd in each of `dirs` over `store`, deploys B1's workflow
/// through the first, then starts `load.runs` runs spread over them and
/// waits until none is left running.
fn measure(load: &Load, store: &str, dirs: &[std::path::PathBuf]) -> Measured {
    let mut flowds: Vec<Flowd> = dirs
        .iter()
        .map(|dir| {
            // B1's concurrency: every run in flight may have its step
            // executing, and no start is refused for the runs in flight
            // (flowd's defaults, 16 steps and 1,000 runs an account, would
            // make this a measure of the quotas).
            let limits = format!(
                "[limits]\nllm_concurrency = {B1_RUNS}\nsteps_in_flight = {B1_RUNS}\nruns_in_flight = {}\n",
                load.runs.max(B1_RUNS)
            );
            std::fs::write(dir.join("flowd.toml"), config(store, KEY) + &limits)
                .expect("the bench config is written");
            Flowd::start(dir)
        })
        .collect();
    let bases: Vec<String> = flowds.iter().map(|f| f.url.clone()).collect();
    // One thread: the load generator shares the machine's two cores with
    // flowd, whose tokio worker it preempted with two (1.9 - 2.4 us of the
    // generator's CPU per step with one thread, 2.1 - 3.7 with two).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let client = reqwest::Client::new();
    runtime.block_on(async {
        let deployed = post_json(
            &client,
            &format!("{}/v1/workflows", bases[0]),
            KEY,
            json!({ "source": ten_steps_source() }),
        )
        .await;
        assert_eq!(deployed.status(), 201);
    });
    let body = json!({ "workflow": "ten", "input": { "q": "x".repeat(1000) } }).to_string();
    let cpu_of_flowds = |flowds: &[Flowd]| {
        flowds
            .iter()
            .map(|flowd| cpu_by_thread(flowd.pid()))
            .collect::<Vec<_>>()
    };

    let flowd_before = cpu_of_flowds(&flowds);
    let generator_before = cpu_by_thread(std::process::id());
    let postgres_before = cpu_of_processes("postgres");
    profiler("enable");
    let start = Instant::now();
    runtime.block_on(async {
        common::start_runs(&bases, KEY, body, load.runs, load.clients).await;
        common::until_none_running(&client, &bases[0], KEY).await;
    });
    let elapsed = start.elapsed();
    profiler("disable");
    let flowd_after = cpu_of_flowds(&flowds);
    let generator_after = cpu_by_thread(std::process::id());
    let postgres = cpu_between(&postgres_before, &cpu_of_processes("postgres"))
        .values()
        .sum();

    runtime.block_on(async {
        let failed = common::get_json(
            &client,
            &format!("{}/v1/runs?status=failed&limit=1", bases[0]),
            KEY,
        )
        .await;
        assert!(
            failed["runs"].as_array().is_some_and(Vec::is_empty),
            "a run failed: {failed}"
        );
    });
    for flowd in &mut flowds {
        flowd.stop();
    }
    let mut flowd = BTreeMap::new();
    for (before, after) in flowd_before.iter().zip(&flowd_after) {
        for (name, time) in cpu_between(before, after) {
            *flowd.entry(name).or_insert(Duration::ZERO) += time;
        }
    }
    let generator = cpu_between(&generator_before, &generator_after)
        .values()
        .sum();
    Measured {
        elapsed,
        flowd,
        generator,
        postgres,
    }
}

/// What PostgreSQL counted: the rows of the bench's schema by table
/// (exact: nothing else writes there), and the server's commits and WAL
/// (server-wide: other clients of the server count too).
#[derive(Default)]
struct Written {
    /// Per table: rows inserted, updated, deleted.
    rows: BTreeMap<String, [i64; 3]>,
    commits: i64,
    wal_records: i64,
    wal_bytes: i64,
    wal_syncs: i64,
}

impl Written {
    async fn read(schema: &str) -> Written {
        let client = flow_tests::postgres::client()
            .await
            .expect("the PostgreSQL server answers");
        let mut written = Written::default();
        for row in client
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1",
                &[&schema],
            )
            .await
            .expect("pg_stat_user_tables")
        {
            written
                .rows
                .insert(row.get(0), [row.get(1), row.get(2), row.get(3)]);
        }
        let database = client
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .expect("pg_stat_database");
        written.commits = database.get(0);
        let wal = client
            .query_one(
                "SELECT wal_records, wal_bytes::bigint, wal_sync FROM pg_stat_wal",
                &[],
            )
            .await
            .expect("pg_stat_wal");
        (written.wal_records, written.wal_bytes, written.wal_syncs) =
            (wal.get(0), wal.get(1), wal.get(2));
        written
    }

    fn since(&self, before: &Written) -> Written {
        Written {
            rows: self
                .rows
                .iter()
                .map(|(table, now)| {
                    let then = before.rows.get(table).copied().unwrap_or_default();
                    (
                        table.clone(),
                        [now[0] - then[0], now[1] - then[1], now[2] - then[2]],
                    )
                })
                .collect(),
            commits: self.commits - before.commits,
            wal_records: self.wal_records - before.wal_records,
            wal_bytes: self.wal_bytes - before.wal_bytes,
            wal_syncs: self.wal_syncs - before.wal_syncs,
        }
    }

    fn per_step(&self, steps: f64) -> String {
        let tables: Vec<String> = self
            .rows
            .iter()
            .filter(|(_, [i, u, d])| (i + u + d) as f64 / steps >= 0.005)
            .map(|(table, [i, u, d])| {
                format!(
                    "{table} +{:.2} ~{:.2} -{:.2}",
                    *i as f64 / steps,
                    *u as f64 / steps,
                    *d as f64 / steps
                )
            })
            .collect();
        format!(
            "PostgreSQL per step: {:.3} commits (server-wide), {:.1} WAL records, {:.0} WAL bytes, {:.3} WAL syncs (server-wide); rows inserted (+), updated (~), deleted (-) per table: {}",
            self.commits as f64 / steps,
            self.wal_records as f64 / steps,
            self.wal_bytes as f64 / steps,
            self.wal_syncs as f64 / steps,
            tables.join(", ")
        )
    }
}
