import { createHash, randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { InvalidRequest, NotFound, type Unauthorized } from "../domain/Errors.ts"
import { DEFAULT_RETENTION_HOURS, type ForkRequest, type TaskView } from "../domain/Tasks.ts"
import { type TaskCredentials, Tasks } from "./Tasks.ts"

export interface SnapshotFileInput {
  readonly path: string
  readonly content?: string
  readonly content_base64?: string
}

export interface StoredSnapshot {
  readonly snapshot_id: string
  readonly task_id: string | null
  readonly files: ReadonlyArray<{ readonly path: string; readonly hash: string; readonly size: number }>
  readonly new_bytes: number
  readonly created_at: number
}

const sha256 = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex")

/**
 * Content-addressed workspaces (spec 4.3; D142): a snapshot is a manifest of paths to SHA-256 hashes,
 * the bytes are stored once per hash whichever tasks name them; a fork is a new task whose lineage
 * names the parent task and the snapshot it starts from. Erasure keeps a snapshot a fork still names.
 */
export class Workspaces extends Context.Service<
  Workspaces,
  {
    readonly store: (
      id: string,
      credentials: TaskCredentials,
      files: ReadonlyArray<SnapshotFileInput>
    ) => Effect.Effect<StoredSnapshot, Unauthorized | InvalidRequest>
    readonly read: (
      id: string,
      snapshotId: string,
      credentials: TaskCredentials
    ) => Effect.Effect<
      {
        readonly snapshot_id: string
        readonly task_id: string | null
        readonly files: ReadonlyArray<{
          readonly path: string
          readonly hash: string
          readonly size: number
          readonly content_base64: string
        }>
        readonly created_at: number
      },
      Unauthorized | NotFound
    >
    readonly fork: (
      id: string,
      snapshotId: string,
      credentials: TaskCredentials,
      input: ForkRequest
    ) => Effect.Effect<{ readonly task: TaskView; readonly token: string }, Unauthorized | NotFound>
    /** The paths of a task's latest snapshot (its artifacts, for a verdict). */
    readonly latestPaths: (taskId: string) => Effect.Effect<ReadonlySet<string>>
  }
>()("router/tasks/Workspaces") {
  static readonly layer = Layer.effect(
    Workspaces,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const tasks = yield* Tasks

      const store = Effect.fn("Workspaces.store")(function* (
        id: string,
        credentials: TaskCredentials,
        files: ReadonlyArray<SnapshotFileInput>
      ) {
        yield* tasks.authorize(id, credentials)
        const seen = new Set<string>()
        const contents: Array<{ path: string; bytes: Uint8Array; hash: string }> = []
        for (const file of files) {
          if (seen.has(file.path)) {
            return yield* new InvalidRequest({
              code: "duplicate_path",
              param: "files",
              message: `${file.path} appears twice`
            })
          }
          seen.add(file.path)
          if ((file.content === undefined) === (file.content_base64 === undefined)) {
            return yield* new InvalidRequest({
              code: "invalid_request",
              param: "files",
              message: `${file.path}: give exactly one of content and content_base64`
            })
          }
          const bytes =
            file.content !== undefined
              ? new Uint8Array(Buffer.from(file.content, "utf8"))
              : new Uint8Array(Buffer.from(file.content_base64!, "base64"))
          contents.push({ path: file.path, bytes, hash: sha256(bytes) })
        }
        const snapshotId = `snap_${randomBytes(12).toString("hex")}`
        const now = yield* Clock.currentTimeMillis
        const newBytes = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`INSERT INTO workspace_snapshots (snapshot_id, task_id, created_at) VALUES (${snapshotId}, ${id}, ${now})`
              let added = 0
              for (const file of contents) {
                const inserted = yield* sql<{ size: number }>`
                  INSERT INTO workspace_blobs (hash, content, size) VALUES (${file.hash}, ${file.bytes}, ${file.bytes.length})
                  ON CONFLICT (hash) DO NOTHING RETURNING size
                `
                added += inserted[0]?.size ?? 0
                yield* sql`INSERT INTO workspace_files (snapshot_id, path, hash) VALUES (${snapshotId}, ${file.path}, ${file.hash})`
              }
              yield* tasks.record(id, "snapshot.stored", { snapshot_id: snapshotId, files: contents.length })
              return added
            })
          )
          .pipe(Effect.orDie)
        return {
          snapshot_id: snapshotId,
          task_id: id,
          files: contents.map((f) => ({ path: f.path, hash: f.hash, size: f.bytes.length })),
          new_bytes: newBytes,
          created_at: now
        } satisfies StoredSnapshot
      })

      /** A task may read its own snapshots and the one it was forked from. */
      const visible = (taskId: string, snapshotId: string) =>
        Effect.gen(function* () {
          const [row] = yield* sql<{ snapshot_id: string; task_id: string | null; created_at: string }>`
            SELECT s.snapshot_id, s.task_id, s.created_at FROM workspace_snapshots s
            WHERE s.snapshot_id = ${snapshotId}
              AND (s.task_id = ${taskId}
                   OR EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = ${taskId} AND t.parent_snapshot_id = s.snapshot_id))
          `.pipe(Effect.orDie)
          if (row === undefined) {
            return yield* new NotFound({
              code: "snapshot_not_found",
              message: `No snapshot ${snapshotId} belongs to this task`
            })
          }
          return row
        })

      const read = Effect.fn("Workspaces.read")(function* (
        id: string,
        snapshotId: string,
        credentials: TaskCredentials
      ) {
        yield* tasks.authorize(id, credentials)
        const row = yield* visible(id, snapshotId)
        const files = yield* sql<{ path: string; hash: string; size: number; content: Uint8Array }>`
          SELECT f.path, f.hash, b.size, b.content FROM workspace_files f JOIN workspace_blobs b ON b.hash = f.hash
          WHERE f.snapshot_id = ${snapshotId} ORDER BY f.path
        `.pipe(Effect.orDie)
        return {
          snapshot_id: row.snapshot_id,
          task_id: row.task_id,
          files: files.map((f) => ({
            path: f.path,
            hash: f.hash,
            size: f.size,
            content_base64: Buffer.from(f.content).toString("base64")
          })),
          created_at: Number(row.created_at)
        }
      })

      const fork = Effect.fn("Workspaces.fork")(function* (
        id: string,
        snapshotId: string,
        credentials: TaskCredentials,
        input: ForkRequest
      ) {
        const parent = yield* tasks.authorize(id, credentials)
        yield* visible(id, snapshotId)
        const created = yield* tasks.create(
          {
            goal: input.goal ?? parent.goal,
            max_steps: input.max_steps ?? parent.max_steps,
            budget: input.budget ?? Number(parent.budget),
            retention_hours: input.retention_hours ?? parent.retention_hours ?? DEFAULT_RETENTION_HOURS
          },
          credentials.token === undefined ? credentials : {},
          { parentTaskId: id, parentSnapshotId: snapshotId }
        )
        yield* sql
          .withTransaction(
            tasks.record(id, "task.forked", { task_id: created.task.id, snapshot_id: snapshotId })
          )
          .pipe(Effect.orDie)
        return created
      })

      const latestPaths = (taskId: string) =>
        Effect.map(
          sql<{ path: string }>`
            SELECT f.path FROM workspace_files f
            WHERE f.snapshot_id = (
              SELECT snapshot_id FROM workspace_snapshots WHERE task_id = ${taskId}
              ORDER BY created_at DESC, snapshot_id DESC LIMIT 1
            )
          `.pipe(Effect.orDie),
          (rows) => new Set(rows.map((r) => r.path))
        )

      return Workspaces.of({ store, read, fork, latestPaths })
    })
  )
}
