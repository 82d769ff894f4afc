//! The PostgreSQL store's schema: each migration once, in order, under an
//! advisory lock so that processes starting together do not race.

use super::*;

/// Schema migrations, applied in order; `flow_migrations` has a row for each.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE plans (
        hash TEXT PRIMARY KEY,
        json TEXT NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        account TEXT NOT NULL,
        workflow TEXT NOT NULL,
        plan_hash TEXT NOT NULL REFERENCES plans(hash),
        status TEXT NOT NULL,
        input TEXT NOT NULL,
        outcome TEXT,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL,
        active_ms BIGINT NOT NULL DEFAULT 0,
        owner TEXT,
        lease_until TIMESTAMPTZ,
        idempotency_key TEXT
    );
    CREATE INDEX runs_by_status ON runs (status);
    CREATE INDEX runs_by_account ON runs (account, created_ms);
    CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (account, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE TABLE step_runs (
        run_id TEXT NOT NULL REFERENCES runs(id),
        path TEXT NOT NULL,
        status TEXT NOT NULL,
        record TEXT NOT NULL,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        due_ms BIGINT,
        PRIMARY KEY (run_id, path)
    );
    CREATE INDEX step_runs_pending ON step_runs (run_id) WHERE status = 'pending';
    CREATE INDEX step_runs_due ON step_runs (due_ms)
        WHERE status = 'pending' AND due_ms IS NOT NULL;
    CREATE TABLE deployments (
        account TEXT NOT NULL,
        workflow TEXT NOT NULL,
        version INTEGER NOT NULL,
        plan_hash TEXT NOT NULL REFERENCES plans(hash),
        created_ms BIGINT NOT NULL,
        PRIMARY KEY (account, workflow, version)
    );
    CREATE TABLE kb_documents (
        account TEXT NOT NULL,
        collection TEXT NOT NULL,
        title TEXT NOT NULL,
        version INTEGER NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT,
        search TSVECTOR GENERATED ALWAYS AS
            (to_tsvector('simple', title || ' ' || content)) STORED,
        PRIMARY KEY (account, collection, title)
    );
    CREATE INDEX kb_documents_search ON kb_documents USING GIN (search);
    CREATE TABLE kb_keys (
        account TEXT NOT NULL,
        key TEXT NOT NULL,
        result TEXT,
        PRIMARY KEY (account, key)
    );
    CREATE TABLE notifications (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        account TEXT NOT NULL,
        kind TEXT NOT NULL,
        audience TEXT NOT NULL,
        run_id TEXT NOT NULL,
        step_path TEXT,
        subject TEXT,
        message TEXT NOT NULL,
        key TEXT,
        created_ms BIGINT NOT NULL,
        mail TEXT,
        mail_attempts INTEGER NOT NULL DEFAULT 0,
        mail_next_ms BIGINT,
        mail_owner TEXT,
        mail_until TIMESTAMPTZ,
        UNIQUE (account, key)
    );
    CREATE INDEX notifications_by_account ON notifications (account, audience);
    CREATE INDEX notifications_to_mail ON notifications (id) WHERE mail IS NULL;
    CREATE TABLE notification_reads (
        notification_id BIGINT NOT NULL REFERENCES notifications(id),
        reader TEXT NOT NULL,
        read_ms BIGINT NOT NULL,
        PRIMARY KEY (notification_id, reader)
    );
    CREATE TABLE notification_sends (
        notification_id BIGINT NOT NULL REFERENCES notifications(id),
        recipient TEXT NOT NULL,
        sent_ms BIGINT NOT NULL,
        PRIMARY KEY (notification_id, recipient)
    );
"#,
    // A document belongs to the department of the workflow that wrote it
    // last; a department's documents are context for its workflows.
    "ALTER TABLE kb_documents ADD COLUMN department TEXT;
     CREATE INDEX kb_documents_by_department ON kb_documents (account, department)
         WHERE department IS NOT NULL;",
    // A run looked up for an account (`account_run`).
    "CREATE INDEX runs_by_account_id ON runs (account, id);",
    // Deployments and runs can be deleted (see the SQLite store's
    // migration 13): version numbers kept apart, lookups by plan and run.
    "CREATE TABLE workflow_versions (
         account TEXT NOT NULL,
         workflow TEXT NOT NULL,
         last_version INTEGER NOT NULL,
         PRIMARY KEY (account, workflow)
     );
     INSERT INTO workflow_versions
         SELECT account, workflow, MAX(version) FROM deployments GROUP BY account, workflow;
     CREATE INDEX runs_by_plan ON runs (plan_hash);
     CREATE INDEX deployments_by_plan ON deployments (plan_hash);
     CREATE INDEX notifications_by_run ON notifications (run_id);",
    // Fencing: each claim of a run starts a new epoch, and a journal writes
    // only while the run is still in the epoch it opened in.
    "ALTER TABLE runs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;",
    // The outbox of run events for webhooks (see the SQLite store's
    // migration 14): the trigger keeps an event in the transaction that
    // changes the run's status. Claims are the database's clock, as leases.
    "CREATE TABLE event_accounts (account TEXT PRIMARY KEY);
     CREATE TABLE run_events (
         id BIGSERIAL PRIMARY KEY,
         account TEXT NOT NULL,
         run_id TEXT NOT NULL,
         workflow TEXT NOT NULL,
         event TEXT NOT NULL,
         outcome TEXT,
         created_ms BIGINT NOT NULL,
         attempts INTEGER NOT NULL DEFAULT 0,
         next_ms BIGINT NOT NULL,
         claimed_until TIMESTAMPTZ,
         reached TEXT[] NOT NULL DEFAULT '{}'
     );
     CREATE INDEX run_events_due ON run_events (next_ms);
     CREATE INDEX run_events_by_run ON run_events (run_id);
     CREATE FUNCTION runs_keep_events() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         IF NEW.status IN ('completed', 'failed', 'pending_approval', 'cancelled')
            AND NEW.status IS DISTINCT FROM OLD.status
            AND EXISTS (SELECT 1 FROM event_accounts WHERE account = NEW.account) THEN
             INSERT INTO run_events (account, run_id, workflow, event, outcome, created_ms, next_ms)
             VALUES (NEW.account, NEW.id, NEW.workflow,
                     CASE NEW.status WHEN 'pending_approval' THEN 'parked' ELSE NEW.status END,
                     NEW.outcome, NEW.updated_ms, NEW.updated_ms);
         END IF;
         RETURN NEW;
     END $$;
     CREATE TRIGGER runs_keep_events AFTER UPDATE OF status ON runs
         FOR EACH ROW EXECUTE FUNCTION runs_keep_events();",
    // How often a run was redriven (`RunStore::redrive_run`).
    "ALTER TABLE runs ADD COLUMN redrives INTEGER NOT NULL DEFAULT 0;",
    // What happened to a run besides its steps (`RunChange`), a JSON array.
    "ALTER TABLE runs ADD COLUMN history TEXT NOT NULL DEFAULT '[]';",
    // Events only for the runs someone takes them for (`EventsOf`): a plan
    // says whether it has destinations, an account whether every run's
    // events are kept or only those of such plans.
    "ALTER TABLE event_accounts ADD COLUMN every_run BOOLEAN NOT NULL DEFAULT true;
     ALTER TABLE plans ADD COLUMN delivers BOOLEAN NOT NULL DEFAULT true;
     UPDATE plans SET delivers = EXISTS (
         SELECT 1 FROM jsonb_array_elements(plans.json::jsonb -> 'workflows') AS workflow
         WHERE jsonb_array_length(COALESCE(workflow -> 'destinations', '[]'::jsonb)) > 0);
     CREATE OR REPLACE FUNCTION runs_keep_events() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         IF NEW.status IN ('completed', 'failed', 'pending_approval', 'cancelled')
            AND NEW.status IS DISTINCT FROM OLD.status
            AND EXISTS (SELECT 1 FROM event_accounts AS kept
                        WHERE kept.account = NEW.account
                          AND (kept.every_run OR EXISTS (
                              SELECT 1 FROM plans WHERE hash = NEW.plan_hash AND delivers))) THEN
             INSERT INTO run_events (account, run_id, workflow, event, outcome, created_ms, next_ms)
             VALUES (NEW.account, NEW.id, NEW.workflow,
                     CASE NEW.status WHEN 'pending_approval' THEN 'parked' ELSE NEW.status END,
                     NEW.outcome, NEW.updated_ms, NEW.updated_ms);
         END IF;
         RETURN NEW;
     END $$;",
    // Runs listed by status (`account_runs`, `GET /v1/runs?status=`): the
    // index on status alone left PostgreSQL to walk the account's runs by
    // time and filter, 35 - 120 ms for the few running ones among 300,000
    // completed; by status, account and time it is one ordered range.
    "DROP INDEX runs_by_status;
     CREATE INDEX runs_by_status ON runs (status, account, created_ms);",
    // A step's record no longer checks its run's row by a foreign key: the
    // writer's fence already reads that row (`FOR SHARE`, with this
    // process as its owner) in the same transaction, and a run is deleted
    // only under `FOR UPDATE` of its row, with its journal first. The
    // check was a trigger and a row lock for every record: 12.3 - 13.7 us
    // a row with it, 7.3 - 8.1 without, inserted as the writer does
    // (docs/benchmarks.md, B9).
    "ALTER TABLE step_runs DROP CONSTRAINT IF EXISTS step_runs_run_id_fkey;",
    // Each account's due events and unmailed notifications in a range of
    // their own (see the SQLite store's migration).
    "DROP INDEX run_events_due;
     CREATE INDEX run_events_due ON run_events (account, next_ms, id);
     DROP INDEX notifications_to_mail;
     CREATE INDEX notifications_to_mail ON notifications (account, id) WHERE mail IS NULL;",
    // An account's unmailed notifications in the order they come due (see
    // the SQLite store's migration).
    "DROP INDEX notifications_to_mail;
     CREATE INDEX notifications_to_mail
         ON notifications (account, (COALESCE(mail_next_ms, created_ms)), id) WHERE mail IS NULL;",
];

/// Creates the schema if asked and applies the migrations it lacks, in one
/// transaction under an advisory lock on the schema's name.
pub(super) async fn migrate(pool: &Pool, schema: Option<&str>) -> Result<(), StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let schema = match schema {
        Some(schema) => schema.to_string(),
        None => tx
            .query_one("SELECT current_schema()", &[])
            .await?
            .get::<_, Option<String>>(0)
            .ok_or_else(|| {
                StoreError::Unusable(
                    "no schema of the server's search_path exists; name one with `?schema=NAME` in the store URL".into(),
                )
            })?,
    };
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('flow migrations ' || $1, 0))",
        &[&schema],
    )
    .await?;
    // The name was checked to be a plain identifier (`split_location`).
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS flow_migrations (
             version INTEGER PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         );"
    ))
    .await?;
    let version: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM flow_migrations", &[])
        .await?
        .get(0);
    if version as usize > MIGRATIONS.len() {
        return Err(StoreError::Unusable(format!(
            "schema {schema} was written by a newer flow (version {version}, this one knows {})",
            MIGRATIONS.len()
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(migration).await?;
        tx.execute(
            "INSERT INTO flow_migrations (version) VALUES ($1)",
            &[&(index as i32 + 1)],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
