//! The SQLite store's schema: each migration once, in order (`PRAGMA user_version`
//! counts those applied).

/// Schema migrations, applied in order; `PRAGMA user_version` counts them.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE plans (
        hash TEXT PRIMARY KEY,
        json TEXT NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow TEXT NOT NULL,
        plan_hash TEXT NOT NULL REFERENCES plans(hash),
        status TEXT NOT NULL,
        input TEXT NOT NULL,
        outcome TEXT,
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE INDEX runs_by_status ON runs(status);
    CREATE TABLE step_runs (
        run_id TEXT NOT NULL REFERENCES runs(id),
        path TEXT NOT NULL,
        status TEXT NOT NULL,
        record TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (run_id, path)
    );
    CREATE TABLE kb_documents (
        collection TEXT NOT NULL,
        title TEXT NOT NULL,
        version INTEGER NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT,
        PRIMARY KEY (collection, title)
    );
    CREATE VIRTUAL TABLE kb_search USING fts5(collection, title, content);
    CREATE TABLE kb_keys (
        key TEXT PRIMARY KEY,
        result TEXT NOT NULL
    );
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        department TEXT NOT NULL,
        subject TEXT,
        message TEXT NOT NULL,
        key TEXT UNIQUE,
        created_ms INTEGER NOT NULL
    );
"#,
    // The active time a run has used, for the workflow's timeout across resumes.
    "ALTER TABLE runs ADD COLUMN active_ms INTEGER NOT NULL DEFAULT 0;",
    // Which process is executing a run (see `claim_run`).
    "ALTER TABLE runs ADD COLUMN owner TEXT;
     CREATE INDEX step_runs_by_seq ON step_runs(seq);",
    // Whose a run is (flowd's accounts; runs of the local CLI have none), and
    // the workflows each account has deployed, by version.
    "ALTER TABLE runs ADD COLUMN account TEXT NOT NULL DEFAULT '';
     CREATE INDEX runs_by_account ON runs(account, created_ms);
     CREATE TABLE deployments (
         account TEXT NOT NULL,
         workflow TEXT NOT NULL,
         version INTEGER NOT NULL,
         plan_hash TEXT NOT NULL REFERENCES plans(hash),
         created_ms INTEGER NOT NULL,
         PRIMARY KEY (account, workflow, version)
     );",
    // Knowledge and notifications belong to an account: one account's
    // workflow can neither overwrite another's document nor get its keyed
    // result. Notifications name their audience (a department, an approver
    // or an approver group), say what they are about, whether they have been
    // mailed (flowd's outbox) and who has read them. A notification takes its
    // run's account. Documents and keys did not say which run wrote them:
    // they go to the one account that has runs, if only one has, and to the
    // local CLI's otherwise.
    "CREATE TABLE kb_documents_v5 (
         account TEXT NOT NULL,
         collection TEXT NOT NULL,
         title TEXT NOT NULL,
         version INTEGER NOT NULL,
         content TEXT NOT NULL,
         metadata TEXT,
         PRIMARY KEY (account, collection, title)
     );
     CREATE TEMP TABLE kb_owner AS
         SELECT CASE WHEN COUNT(DISTINCT account) = 1 THEN MAX(account) ELSE '' END AS account FROM runs;
     INSERT INTO kb_documents_v5
         SELECT (SELECT account FROM kb_owner), collection, title, version, content, metadata FROM kb_documents;
     DROP TABLE kb_documents;
     ALTER TABLE kb_documents_v5 RENAME TO kb_documents;
     DROP TABLE kb_search;
     CREATE VIRTUAL TABLE kb_search USING fts5(account UNINDEXED, collection, title, content);
     INSERT INTO kb_search (account, collection, title, content)
         SELECT account, collection, title, content FROM kb_documents;
     CREATE TABLE kb_keys_v5 (
         account TEXT NOT NULL,
         key TEXT NOT NULL,
         result TEXT NOT NULL,
         PRIMARY KEY (account, key)
     );
     INSERT INTO kb_keys_v5 SELECT (SELECT account FROM kb_owner), key, result FROM kb_keys;
     DROP TABLE kb_owner;
     DROP TABLE kb_keys;
     ALTER TABLE kb_keys_v5 RENAME TO kb_keys;
     CREATE TABLE notifications_v5 (
         id INTEGER PRIMARY KEY,
         account TEXT NOT NULL,
         kind TEXT NOT NULL,
         audience TEXT NOT NULL,
         run_id TEXT NOT NULL,
         step_path TEXT,
         subject TEXT,
         message TEXT NOT NULL,
         key TEXT,
         created_ms INTEGER NOT NULL,
         mail TEXT,
         UNIQUE (account, key)
     );
     INSERT INTO notifications_v5 (id, account, kind, audience, run_id, subject, message, key, created_ms, mail)
         SELECT id, COALESCE((SELECT account FROM runs WHERE runs.id = notifications.run_id), ''),
                'handoff', department, run_id, subject, message, key, created_ms, 'skipped'
         FROM notifications;
     DROP TABLE notifications;
     ALTER TABLE notifications_v5 RENAME TO notifications;
     CREATE INDEX notifications_by_account ON notifications(account, audience);
     CREATE INDEX notifications_to_mail ON notifications(id) WHERE mail IS NULL;
     CREATE TABLE notification_reads (
         notification_id INTEGER NOT NULL REFERENCES notifications(id),
         reader TEXT NOT NULL,
         read_ms INTEGER NOT NULL,
         PRIMARY KEY (notification_id, reader)
     );",
    // A client's idempotency key for starting a run: the same key in one
    // account starts one run, however often the request is retried.
    "ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
     CREATE UNIQUE INDEX runs_by_idempotency_key ON runs(account, idempotency_key)
         WHERE idempotency_key IS NOT NULL;",
    // The gates waiting for a decision, counted for flowd's metrics without
    // reading every step record.
    "CREATE INDEX step_runs_pending ON step_runs(run_id) WHERE status = 'pending';",
    // When each pending gate expires (`approval::gate_due_ms`), so that the
    // gates due are found by an index, not by reading every parked run.
    "ALTER TABLE step_runs ADD COLUMN due_ms INTEGER;
     UPDATE step_runs
        SET due_ms = json_extract(record, '$.started_ms') + json_extract(record, '$.input.expires_ms')
      WHERE status = 'pending' AND json_extract(record, '$.input.expires_ms') IS NOT NULL;
     CREATE INDEX step_runs_due ON step_runs(due_ms) WHERE status = 'pending' AND due_ms IS NOT NULL;",
    // The outbox retries: an SMTP server down for a while delays emails, it
    // does not lose them; a recipient reached is not mailed again.
    "ALTER TABLE notifications ADD COLUMN mail_attempts INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE notifications ADD COLUMN mail_next_ms INTEGER;
     CREATE TABLE notification_sends (
         notification_id INTEGER NOT NULL REFERENCES notifications(id),
         recipient TEXT NOT NULL,
         sent_ms INTEGER NOT NULL,
         PRIMARY KEY (notification_id, recipient)
     );",
    // A document belongs to the department of the workflow that wrote it
    // last (none for documents written before departments existed, or by a
    // workflow that names none); a department's documents are context for
    // its workflows.
    "ALTER TABLE kb_documents ADD COLUMN department TEXT;
     CREATE INDEX kb_documents_by_department ON kb_documents(account, department)
         WHERE department IS NOT NULL;",
    // A run looked up for an account: whether it is the account's is read
    // from this index, never from the run's row, whose input and outcome
    // may take many pages (`account_run`).
    "CREATE INDEX runs_by_account_id ON runs(account, id);",
    // A document's row in the full-text index, by its rowid: FTS5 finds rows
    // by rowid or MATCH only, and deleting one by (account, collection,
    // title) read the whole index, once per write (a loop of 5,000 writes
    // took minutes). FTS5 keeps its rowids across VACUUM; a table's own
    // rowid (kb_documents has no INTEGER PRIMARY KEY) may change, so the
    // link is a column of its own.
    "ALTER TABLE kb_documents ADD COLUMN search_id INTEGER;
     UPDATE kb_documents SET search_id = rowid;
     DELETE FROM kb_search;
     INSERT INTO kb_search (rowid, account, collection, title, content)
         SELECT search_id, account, collection, title, content FROM kb_documents;",
    // Deployments and runs can be deleted, and the plans nothing uses then
    // with them. A workflow's last version number is kept apart from its
    // deployments, so that a number is never given twice (a client may
    // have pinned it); plans are found by the runs and deployments using
    // them, notifications by run.
    "CREATE TABLE workflow_versions (
         account TEXT NOT NULL,
         workflow TEXT NOT NULL,
         last_version INTEGER NOT NULL,
         PRIMARY KEY (account, workflow)
     );
     INSERT INTO workflow_versions
         SELECT account, workflow, MAX(version) FROM deployments GROUP BY account, workflow;
     CREATE INDEX runs_by_plan ON runs(plan_hash);
     CREATE INDEX deployments_by_plan ON deployments(plan_hash);
     CREATE INDEX notifications_by_run ON notifications(run_id);",
    // The outbox of run events for webhooks (`EventStore`). The trigger
    // keeps an event in the transaction that changes the run's status,
    // whatever changes it, for the accounts flowd has endpoints for.
    "CREATE TABLE event_accounts (account TEXT PRIMARY KEY);
     CREATE TABLE run_events (
         id INTEGER PRIMARY KEY AUTOINCREMENT,
         account TEXT NOT NULL,
         run_id TEXT NOT NULL,
         workflow TEXT NOT NULL,
         event TEXT NOT NULL,
         outcome TEXT,
         created_ms INTEGER NOT NULL,
         attempts INTEGER NOT NULL DEFAULT 0,
         next_ms INTEGER NOT NULL,
         claimed_until INTEGER NOT NULL DEFAULT 0,
         reached TEXT NOT NULL DEFAULT '[]'
     );
     CREATE INDEX run_events_due ON run_events(next_ms);
     CREATE INDEX run_events_by_run ON run_events(run_id);
     CREATE TRIGGER runs_keep_events AFTER UPDATE OF status ON runs
     WHEN NEW.status IN ('completed', 'failed', 'pending_approval', 'cancelled')
          AND NEW.status IS NOT OLD.status
          AND EXISTS (SELECT 1 FROM event_accounts WHERE account = NEW.account)
     BEGIN
         INSERT INTO run_events (account, run_id, workflow, event, outcome, created_ms, next_ms)
         VALUES (NEW.account, NEW.id, NEW.workflow,
                 CASE NEW.status WHEN 'pending_approval' THEN 'parked' ELSE NEW.status END,
                 NEW.outcome, NEW.updated_ms, NEW.updated_ms);
     END;",
    // How often a run was redriven (`RunStore::redrive_run`).
    "ALTER TABLE runs ADD COLUMN redrives INTEGER NOT NULL DEFAULT 0;",
    // What happened to a run besides its steps (`RunChange`), a JSON array.
    "ALTER TABLE runs ADD COLUMN history TEXT NOT NULL DEFAULT '[]';",
    // Events only for the runs someone takes them for (`EventsOf`): a plan
    // says whether it has destinations, an account whether every run's
    // events are kept or only those of such plans.
    "ALTER TABLE event_accounts ADD COLUMN every_run INTEGER NOT NULL DEFAULT 1;
     ALTER TABLE plans ADD COLUMN delivers INTEGER NOT NULL DEFAULT 1;
     UPDATE plans SET delivers = EXISTS (
         SELECT 1 FROM json_each(plans.json, '$.workflows') AS workflow
         WHERE json_array_length(workflow.value, '$.destinations') > 0);
     DROP TRIGGER runs_keep_events;
     CREATE TRIGGER runs_keep_events AFTER UPDATE OF status ON runs
     WHEN NEW.status IN ('completed', 'failed', 'pending_approval', 'cancelled')
          AND NEW.status IS NOT OLD.status
          AND EXISTS (SELECT 1 FROM event_accounts AS kept
                      WHERE kept.account = NEW.account
                        AND (kept.every_run OR EXISTS (
                            SELECT 1 FROM plans WHERE hash = NEW.plan_hash AND delivers)))
     BEGIN
         INSERT INTO run_events (account, run_id, workflow, event, outcome, created_ms, next_ms)
         VALUES (NEW.account, NEW.id, NEW.workflow,
                 CASE NEW.status WHEN 'pending_approval' THEN 'parked' ELSE NEW.status END,
                 NEW.outcome, NEW.updated_ms, NEW.updated_ms);
     END;",
    // A record's place in its run (`seq`) as the table's own row id: a new
    // row's is the largest plus one without asking, where `MAX(seq) + 1`
    // and an index on `seq` to answer it were a fifth of each insert's
    // work. Rows keep their order; their numbers may close up.
    "CREATE TABLE step_runs_by_row (
         seq INTEGER PRIMARY KEY,
         run_id TEXT NOT NULL REFERENCES runs(id),
         path TEXT NOT NULL,
         status TEXT NOT NULL,
         record TEXT NOT NULL,
         due_ms INTEGER,
         UNIQUE (run_id, path)
     );
     INSERT INTO step_runs_by_row (run_id, path, status, record, due_ms)
         SELECT run_id, path, status, record, due_ms FROM step_runs ORDER BY seq, rowid;
     DROP TABLE step_runs;
     ALTER TABLE step_runs_by_row RENAME TO step_runs;
     CREATE INDEX step_runs_pending ON step_runs(run_id) WHERE status = 'pending';
     CREATE INDEX step_runs_due ON step_runs(due_ms) WHERE status = 'pending' AND due_ms IS NOT NULL;",
    // Runs listed by status (`account_runs`, `GET /v1/runs?status=`) read
    // one ordered range of this index rather than every run of the account
    // (see the PostgreSQL store's migration).
    "DROP INDEX runs_by_status;
     CREATE INDEX runs_by_status ON runs(status, account, created_ms);",
    // Each account's due events and unmailed notifications in a range of
    // their own (`due_events`, `to_mail`): those queries seek into each
    // account's range instead of ranking every due row on each call, which
    // cost in proportion to the largest backlog, on every delivery.
    "DROP INDEX run_events_due;
     CREATE INDEX run_events_due ON run_events(account, next_ms);
     DROP INDEX notifications_to_mail;
     CREATE INDEX notifications_to_mail ON notifications(account, id) WHERE mail IS NULL;",
    // An account's unmailed notifications in the order they come due (a
    // retry's time, or else the notification's creation): the due ones
    // are a range that `to_mail`'s seek ends, where by id it walked every
    // one waiting for a retry, on every poll while a mail server was down.
    "DROP INDEX notifications_to_mail;
     CREATE INDEX notifications_to_mail
         ON notifications(account, COALESCE(mail_next_ms, created_ms), id) WHERE mail IS NULL;",
];
