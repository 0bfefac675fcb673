import { Clock, Effect, Result, Schema } from "effect"
import type { SqlClient } from "effect/sql"
import type { BroadcastResult, ChainError, ChainShape, OutgoingCall } from "../chain/Chain.ts"
import type { GasPlan } from "../chain/Outgoing.ts"
import type { TransferOutcome } from "./Transfers.ts"

/**
 * The treasury's book (`Treasury.ts`): every statement over `outgoing_transactions` and `treasury_senders`,
 * and what this process knows of its senders' nonces (D331). Nothing here talks to the chain but the
 * signing and the mined count a record transaction needs.
 */

/** A row of `outgoing_transactions`. */
export const Recorded = Schema.Struct({
  id: Schema.String,
  purpose: Schema.String,
  sender: Schema.String,
  nonce: Schema.String,
  tx_hash: Schema.String,
  raw_tx: Schema.String,
  to_address: Schema.String,
  call_data: Schema.String,
  status: Schema.Literals(["signed", "broadcast", "mined", "reverted", "void"]),
  block_number: Schema.NullOr(Schema.String)
})
export type Recorded = typeof Recorded.Type
const decodeRecorded = Schema.decodeUnknownEffect(Schema.Array(Recorded))

/** How long one answer of the node's mined count backs the kept nonce of a sender (D331). */
export const NONCE_TRUST_MS = 30_000

const COLUMNS =
  "id::text AS id, purpose, sender, nonce::text AS nonce, tx_hash, raw_tx, to_address, call_data, status, block_number::text AS block_number"

/** A transfer to sign: estimated, not yet recorded. */
export interface Planned {
  readonly purpose: string
  readonly kind: string
  readonly call: OutgoingCall
  readonly plan: GasPlan
}

/** What a broadcast did: the node's answer, or the error that kept it from answering. */
export type Offered = BroadcastResult | { readonly error: string }

/** Two nonces (decimal strings, as recorded) in numeric order. */
export const compareNonces = (a: string, b: string) => {
  const x = BigInt(a)
  const y = BigInt(b)
  return x < y ? -1 : x > y ? 1 : 0
}

/** Items by key, keys in order (senders locked one after another, always in the same order). */
export const groupBy = <A>(items: ReadonlyArray<A>, key: (item: A) => string) => {
  const groups = new Map<string, Array<A>>()
  for (const item of items) {
    const k = key(item)
    const group = groups.get(k)
    if (group === undefined) groups.set(k, [item])
    else group.push(item)
  }
  return [...groups].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
}

/** How a record already final ended; undefined while it is open. */
export const outcomeOf = (record: Recorded): TransferOutcome | undefined =>
  record.status === "mined"
    ? { status: "success", blockNumber: BigInt(record.block_number ?? "0") }
    : record.status === "reverted"
      ? { status: "reverted", blockNumber: BigInt(record.block_number ?? "0") }
      : record.status === "void"
        ? { status: "replaced" }
        : undefined

export type TreasuryRecords = ReturnType<typeof makeTreasuryRecords>

/** The book's statements over `sql`; `chain` signs and tells the mined count inside a record transaction. */
export const makeTreasuryRecords = (sql: SqlClient.SqlClient, chain: ChainShape) => {
  const decoded = <E, R>(rows: Effect.Effect<ReadonlyArray<unknown>, E, R>) =>
    rows.pipe(Effect.flatMap(decodeRecorded), Effect.orDie)

  /** The live transaction recorded for each purpose that has one, in one statement. */
  const liveForAll = (purposes: ReadonlyArray<string>) =>
    purposes.length === 0
      ? Effect.succeed(new Map<string, Recorded>())
      : decoded(
          sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
              WHERE purpose IN ${sql.in(purposes)} AND status IN ('signed', 'broadcast', 'mined')`
        ).pipe(Effect.map((rows) => new Map(rows.map((row) => [row.purpose, row] as const))))

  /** The same purpose must always mean the same call: anything else is a bug, never a second transfer. */
  const requireSameCall = (record: Recorded, call: OutgoingCall) =>
    record.to_address === call.to.toLowerCase() &&
    record.call_data === call.data.toLowerCase() &&
    record.sender === call.from.toLowerCase()
      ? Effect.void
      : Effect.die(new Error(`purpose ${record.purpose} is recorded with another transfer`))

  // Senders whose row a committed transaction of this process wrote or found: rows are never deleted,
  // so their insert is not sent again (one statement fewer in every send's transaction).
  const knownSenders = new Set<string>()
  // When this process last asked the node for a sender's mined count (Clock ms), per sender. Within
  // `NONCE_TRUST_MS` of that ask and with no doubt since, the kept `next_nonce` is authoritative: every
  // nonce of the sender is handed out under its row lock, and the ask put the kept one at or above the
  // chain's count. A nonce found taken (a broadcast refused `nonceUsed`, a record voided) drops the
  // sender from here, so the next send asks the node again (docs/decisions.md D331).
  const nonceAskedAt = new Map<string, number>()
  const distrustNonce = (sender: string) => Effect.sync(() => nonceAskedAt.delete(sender.toLowerCase()))

  /**
   * Takes the sender's next nonces under its row lock, signs, and records the signed bytes, all in one
   * database transaction: a nonce is spent exactly when its record exists. The first nonce is the higher
   * of the lowest one no record holds and the chain's mined count (a transaction sent by someone else);
   * the transfers take it and the ones after it, in order, and every record is one insert (D490).
   * Returns the records made, the purposes another instance recorded while this one waited for the
   * lock (adopted, never signed twice), and the transfers that could not be signed.
   */
  const recordAll = (sender: string, planned: ReadonlyArray<Planned>) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          if (!knownSenders.has(sender))
            yield* sql`INSERT INTO treasury_senders (address, next_nonce) VALUES (${sender}, 0)
                     ON CONFLICT (address) DO NOTHING`
          const [lock] = yield* sql<{ next_nonce: string }>`
          SELECT next_nonce::text AS next_nonce FROM treasury_senders WHERE address = ${sender} FOR UPDATE`
          // Another instance may have recorded some of these purposes while we waited for the lock.
          const raced = yield* liveForAll(planned.map((p) => p.purpose))
          const unsigned = planned.filter((p) => !raced.has(p.purpose))
          const refused = new Map<string, ChainError>()
          if (unsigned.length === 0) return { raced, recorded: [], refused, askedAt: undefined }
          const kept = Number(lock?.next_nonce ?? 0)
          const now = yield* Clock.currentTimeMillis
          const askedAt = nonceAskedAt.get(sender)
          const trusted = askedAt !== undefined && now >= askedAt && now - askedAt < NONCE_TRUST_MS
          let nonce = trusted
            ? kept
            : Math.max(kept, yield* chain.outgoing.minedNonce(unsigned[0]!.call.from))
          const signed: Array<Record<string, string | number>> = []
          for (const p of unsigned) {
            const tx = yield* Effect.result(chain.outgoing.sign(p.call, p.plan, nonce))
            if (Result.isFailure(tx)) {
              refused.set(p.purpose, tx.failure)
              continue
            }
            signed.push({
              purpose: p.purpose,
              kind: p.kind,
              nonce,
              tx_hash: tx.success.hash,
              raw_tx: tx.success.raw,
              to_address: p.call.to.toLowerCase(),
              call_data: p.call.data.toLowerCase()
            })
            nonce++
          }
          if (signed.length === 0) return { raced, recorded: [], refused, askedAt: undefined }
          // The records and the sender's next nonce in one statement (D332): a data-modifying CTE runs
          // exactly once whether or not it is read, and fails or commits with the insert.
          const recorded = yield* decoded(sql`
          WITH kept AS (
            UPDATE treasury_senders SET next_nonce = ${nonce}, updated_at = now() WHERE address = ${sender}
          )
          INSERT INTO outgoing_transactions (purpose, kind, sender, nonce, tx_hash, raw_tx, to_address, call_data, status)
          SELECT v.purpose, v.kind, ${sender}, v.nonce, v.tx_hash, v.raw_tx, v.to_address, v.call_data, 'signed'
          FROM jsonb_to_recordset(${JSON.stringify(signed)}::jsonb)
            AS v(purpose text, kind text, nonce bigint, tx_hash text, raw_tx text, to_address text, call_data text)
          RETURNING ${sql.literal(COLUMNS)}`)
          // Only a kept nonce that this transaction raised to the node's count may be trusted after it.
          return { raced, recorded, refused, askedAt: trusted ? undefined : now }
        })
      )
      .pipe(
        // After commit only: a rolled-back transaction may leave the kept nonce below what the node said.
        Effect.tap((result) =>
          Effect.sync(() => {
            knownSenders.add(sender)
            if (result.askedAt !== undefined) nonceAskedAt.set(sender, result.askedAt)
          })
        ),
        Effect.catchTag("SqlError", (e) => Effect.die(e))
      )

  /** What the offers did, in one statement: taken ones are `broadcast`, failed ones keep their error. */
  const noteOffers = (offers: ReadonlyArray<readonly [Recorded, Offered]>) => {
    const notes = new Map<string, string | null>()
    for (const [record, offered] of offers)
      if (offered !== "nonceUsed")
        notes.set(record.id, offered === "accepted" ? null : offered.error.slice(0, 300))
    if (notes.size === 0) return Effect.void
    const rows = [...notes].map(([id, error]) => ({ id, error }))
    return sql`UPDATE outgoing_transactions o
               SET status = CASE WHEN v.error IS NULL THEN 'broadcast' ELSE o.status END,
                   broadcasts = o.broadcasts + CASE WHEN v.error IS NULL THEN 1 ELSE 0 END,
                   last_error = v.error, updated_at = now()
               FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS v(id bigint, error text)
               WHERE o.id = v.id AND o.status IN ('signed', 'broadcast')`.pipe(Effect.asVoid, Effect.orDie)
  }

  /** Final outcomes, written in one statement; a replaced one puts its sender's kept nonce in doubt. */
  const finalizeAll = (finals: ReadonlyArray<readonly [Recorded, TransferOutcome]>) =>
    Effect.gen(function* () {
      if (finals.length === 0) return
      const rows = finals.map(([record, outcome]) => ({
        id: record.id,
        status: outcome.status === "success" ? "mined" : outcome.status === "reverted" ? "reverted" : "void",
        block_number: outcome.status === "replaced" ? null : outcome.blockNumber.toString()
      }))
      yield* sql`UPDATE outgoing_transactions o
                 SET status = v.status, block_number = v.block_number, updated_at = now()
                 FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
                   AS v(id bigint, status text, block_number bigint)
                 WHERE o.id = v.id AND o.status IN ('signed', 'broadcast')`.pipe(Effect.orDie)
      for (const [record, outcome] of finals) {
        if (outcome.status === "replaced") yield* distrustNonce(record.sender)
        if (outcome.status !== "success")
          yield* Effect.logWarning("outgoing transaction moved nothing", {
            purpose: record.purpose,
            tx_hash: record.tx_hash,
            outcome: outcome.status
          })
      }
    })

  /** A sender's open records below `highest`, lowest first (the gaps a look fills, D169). */
  const openBelow = (sender: string, highest: bigint) =>
    decoded(
      sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
          WHERE sender = ${sender} AND nonce < ${highest.toString()} AND status IN ('signed', 'broadcast')
          ORDER BY outgoing_transactions.nonce`
    )

  /** Every record of a purpose, whatever its status, oldest first (D533). */
  const everyAttempt = (purpose: string) =>
    decoded(
      sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions WHERE purpose = ${purpose}
          ORDER BY outgoing_transactions.created_at`
    )

  /** The records of these (lower-case) hashes. */
  const byHashes = (hashes: ReadonlyArray<string>) =>
    decoded(sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions WHERE tx_hash IN ${sql.in(hashes)}`)

  /** Every open record, per sender in nonce order (the recovery pass). */
  const allOpen = decoded(
    sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
        WHERE status IN ('signed', 'broadcast') ORDER BY outgoing_transactions.sender, outgoing_transactions.nonce`
  )

  return {
    liveForAll,
    requireSameCall,
    distrustNonce,
    recordAll,
    noteOffers,
    finalizeAll,
    openBelow,
    everyAttempt,
    byHashes,
    allOpen
  }
}
