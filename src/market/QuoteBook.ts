import { Clock, Config, Context, Effect, Layer, Schema, type Scope } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { type Hex, recoverMessageAddress } from "viem"
import { passWhenWoken, repeatInBackground, type Wake } from "../Background.ts"
import { Instances } from "../db/Instances.ts"
import { Conflict, Forbidden, InvalidRequest, ServiceUnavailable, Unauthorized } from "../domain/Errors.ts"
import { quoteSigningString, SignedQuote } from "../domain/Quote.ts"
import { elapsedMs } from "../process/ElapsedClock.ts"
import { acquireReleaseLean } from "../process/Resource.ts"
import { traced } from "../Telemetry.ts"
import type { LiveQuote } from "./Auction.ts"
import { ModelCatalog } from "./ModelCatalog.ts"
import { providerNumber } from "./ProviderNumbers.ts"
import { Providers } from "./Providers.ts"
import { QuotesById } from "./QuotesById.ts"
import { type WarmLease, WarmLeases } from "./WarmLeases.ts"

/** Spec 8: a quote's TTL is at most 30 s; payment and quote checks allow 5 s of clock skew. */
export const MAX_QUOTE_TTL_S = 30
export const CLOCK_SKEW_S = 5
/**
 * A capacity lease outlives its request only if an instance dies mid-request; it is longer than
 * the serving deadline (15 minutes) so a live request never loses its slot.
 */
export const LEASE_TTL = "20 minutes"
/**
 * The oldest a warm lease may be and still be taken over (D555): its 20-minute TTL must cover the longest
 * request (the 15-minute serving deadline) from the moment it is taken, with a minute to spare.
 */
export const WARM_REUSE_MS = 4 * 60 * 1000

export type QuoteRejection = InvalidRequest | Unauthorized | Forbidden | Conflict

/**
 * A capacity slot held for the life of a scope: its lease row's id. A caller whose own statement
 * deletes the row (the capture or release of the request it served) asks `endsWith` which row that
 * statement ends, and says so with `handOff` once it ran; closing the scope then frees the slot in
 * memory only, with no round trip of its own. `endsWith` answers `undefined` when the lease stays warm
 * for the next request instead (D555): the statement leaves the row, and closing the scope keeps it.
 */
export interface Slot {
  readonly leaseId: string
  readonly endsWith: () => string | undefined
  readonly handOff: () => void
}

/**
 * A capacity lease another statement takes with its own work (the credit reservation's, D311): the
 * row's id and the quote's signed ceiling.
 */
export interface LeaseRequest {
  readonly leaseId: string
  readonly providerId: string
  readonly modelClass: string
  readonly capacity: number
  /**
   * When it was asked for (`elapsedMs`, D560), before its statement wrote the row: how old a warm lease is counts
   * from here, so the row's TTL is never overstated (D555).
   */
  readonly requestedAt: number
}

/** A lease asked for with a reservation, and whether the ceiling let it be taken. */
export interface HeldLease {
  readonly lease: LeaseRequest
  readonly granted: boolean
}

export const leaseRequestOf = (quote: SignedQuote): LeaseRequest => ({
  leaseId: crypto.randomUUID(),
  providerId: quote.provider_id,
  modelClass: quote.model_class,
  capacity: quote.capacity_rps,
  requestedAt: elapsedMs()
})

/**
 * The expression that takes a lease (`acquire_capacity`, migration 0039): true when taken, false at the
 * ceiling. The lease holds one of the (provider, class)'s numbered slots below the ceiling, and no two
 * live leases hold the same slot, in a statement of its own or inside a larger one, so the ceiling holds
 * across instances either way; takers pass over each other's slots instead of queueing (D541).
 */
export const acquireCapacity = (sql: SqlClient.SqlClient, lease: LeaseRequest): Statement.Fragment =>
  sql`acquire_capacity(${lease.providerId}, ${lease.modelClass}, ${lease.capacity}, ${lease.leaseId}, ${LEASE_TTL}::interval)`

export const capacityExhausted = (providerId: string, modelClass: string) =>
  new ServiceUnavailable({
    code: "capacity_exhausted",
    message: `${providerId} is at its signed capacity for ${modelClass}`
  })

const slotKey = (providerId: string, modelClass: string) => `${providerId}\u0000${modelClass}`

/** Canonical JSON of a quote, so a re-post of the identical quote is recognised. */
const canonical = (q: SignedQuote) => JSON.stringify(Schema.encodeSync(SignedQuote)(q), Object.keys(q).sort())

const decodeStored = Schema.decodeUnknownEffect(
  Schema.Array(Schema.Struct({ seq: Schema.String, body: SignedQuote }))
)

/**
 * The live quote book. Quotes are verified once, at ingest, persisted for audit, and held
 * in memory per instance: the newest quote of each (provider, class) is that provider's
 * standing offer for the class until its `valid_until`. Instances share quotes through the
 * `quotes` table (a sync fiber reads what others ingested). Capacity slots are leases in
 * the database, so `capacity_rps` holds across every instance.
 */
export class QuoteBook extends Context.Service<
  QuoteBook,
  {
    readonly ingest: (quote: SignedQuote) => Effect.Effect<SignedQuote, QuoteRejection>
    /** Live standing quotes with this instance's view of their in-flight counts. */
    readonly live: Effect.Effect<ReadonlyArray<LiveQuote>>
    /**
     * Takes one concurrency slot on the quote's (provider, class) for the life of the
     * scope; fails when the signed ceiling is reached across all instances.
     */
    readonly acquireSlot: (quote: SignedQuote) => Effect.Effect<Slot, ServiceUnavailable, Scope.Scope>
    /**
     * Holds, for the life of the scope, a lease another statement took (`acquireCapacity`): counted in
     * flight here and released as `acquireSlot`'s is.
     */
    readonly adoptSlot: (lease: LeaseRequest) => Effect.Effect<Slot, never, Scope.Scope>
    /**
     * Whether a warm lease of the quote's (provider, class) is idle here (D555): `acquireSlot` then takes it
     * without a round trip, so a reservation need not take one in its statement.
     */
    readonly hasWarm: (quote: SignedQuote) => boolean
    readonly sync: Effect.Effect<void>
  }
>()("router/market/QuoteBook") {
  static readonly layer = Layer.effect(
    QuoteBook,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const providers = yield* Providers
      const catalog = yield* ModelCatalog
      const instances = yield* Instances
      const standing = new Map<string, SignedQuote>()
      const byId = new QuotesById()
      const inFlight = new Map<string, number>()
      let lastSeq = 0n

      const offer = (quote: SignedQuote) => {
        const key = slotKey(quote.provider_id, quote.model_class)
        const current = standing.get(key)
        if (current === undefined || current.valid_until <= quote.valid_until) {
          standing.set(key, quote)
          if (current !== undefined) byId.remove(current)
          byId.add(key, quote, providerNumber(quote.provider_id))
        }
      }

      const ingest = Effect.fnUntraced(function* (quote: SignedQuote) {
        yield* Effect.annotateCurrentSpan({
          quote_id: quote.quote_id,
          provider_id: quote.provider_id,
          model_class: quote.model_class
        })
        const provider = providers.get(quote.provider_id)
        if (provider === undefined) {
          return yield* new Forbidden({
            code: "provider_not_registered",
            param: "provider_id",
            message: `Provider ${quote.provider_id} is not registered`
          })
        }
        if (!provider.enabled) {
          return yield* new Forbidden({
            code: "provider_disabled",
            param: "provider_id",
            message: `Provider ${quote.provider_id} is disabled`
          })
        }
        if (catalog.find(quote.model_class) === undefined) {
          return yield* new InvalidRequest({
            code: "unknown_model_class",
            param: "model_class",
            message: `Unknown model class ${quote.model_class}`
          })
        }
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        if (quote.valid_until <= nowS - CLOCK_SKEW_S) {
          return yield* new InvalidRequest({
            code: "quote_expired",
            param: "valid_until",
            message: "valid_until is in the past"
          })
        }
        if (quote.valid_until > nowS + MAX_QUOTE_TTL_S + CLOCK_SKEW_S) {
          return yield* new InvalidRequest({
            code: "quote_ttl_too_long",
            param: "valid_until",
            message: `valid_until may be at most ${MAX_QUOTE_TTL_S} s ahead`
          })
        }
        const { sig, ...unsigned } = quote
        const recovered = yield* Effect.tryPromise(() =>
          recoverMessageAddress({ message: quoteSigningString(unsigned), signature: sig as Hex })
        ).pipe(Effect.orElseSucceed(() => "0x"))
        if (recovered.toLowerCase() !== provider.signer.toLowerCase()) {
          return yield* new Unauthorized({
            code: "invalid_signature",
            param: "sig",
            message: "The quote is not signed by the provider's registered signer"
          })
        }
        const body = Schema.encodeSync(SignedQuote)(quote)
        const inserted = yield* sql`
          INSERT INTO quotes (quote_id, provider_id, model_class, price_in, price_out, max_context, valid_until,
                              capacity_rps, body)
          VALUES (${quote.quote_id}, ${quote.provider_id}, ${quote.model_class}, ${quote.price_in},
                  ${quote.price_out}, ${quote.max_context}, ${quote.valid_until}, ${quote.capacity_rps},
                  ${JSON.stringify(body)}::jsonb)
          ON CONFLICT (quote_id) DO NOTHING
          RETURNING quote_id
        `.pipe(Effect.orDie)
        if (inserted.length === 0) {
          const stored = yield* sql<{
            body: unknown
          }>`SELECT body FROM quotes WHERE quote_id = ${quote.quote_id}`.pipe(Effect.orDie)
          const previous = yield* Schema.decodeUnknownEffect(SignedQuote)(stored[0]?.body).pipe(Effect.orDie)
          if (canonical(previous) !== canonical(quote)) {
            return yield* new Conflict({
              code: "quote_id_reused",
              param: "quote_id",
              message: `quote_id ${quote.quote_id} was already used with different fields`
            })
          }
        }
        offer(quote)
        return quote
      }, traced("QuoteBook.ingest"))

      const live = Effect.map(Clock.currentTimeMillis, (nowMs) => {
        const quotes: Array<LiveQuote> = []
        // In quote id order: the auction then lists its exclusions without sorting them.
        for (const { key, quote, provider: number } of byId.all) {
          const provider = providers.get(quote.provider_id)
          if (quote.valid_until * 1000 <= nowMs || provider === undefined || !provider.enabled) continue
          quotes.push({ quote, inFlight: inFlight.get(key) ?? 0, provider: number })
        }
        return quotes
      })

      const sync = Effect.gen(function* () {
        yield* providers.refresh
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const rows = yield* sql`
          SELECT seq::text AS seq, body FROM quotes
          WHERE seq > ${lastSeq.toString()}::bigint AND valid_until > ${nowS}
          ORDER BY seq
        `.pipe(Effect.flatMap(decodeStored), Effect.orDie)
        for (const row of rows) {
          offer(row.body)
          lastSeq = BigInt(row.seq)
        }
        for (const [key, quote] of standing)
          if (quote.valid_until < nowS - 60) {
            standing.delete(key)
            byId.remove(quote)
          }
      }).pipe(Effect.withSpan("QuoteBook.sync"))

      // Leases kept warm between requests (D555), and the statement that gives rows back.
      const warm = new WarmLeases({
        idleMs: yield* Config.Int("CAPACITY_WARM_MS").pipe(Config.withDefault(250)),
        reuseMs: WARM_REUSE_MS,
        perKey: 1024
      })
      // Real time, as the rows' expiry is the database's: a test moving the router's clock does not age them; and
      // time that never steps back, so a lease never looks younger than its row (D560).
      const elapsedNow = Effect.sync(elapsedMs)
      // Rows to delete: a statement that fails keeps its ids here for the next pass, so a database blip does not
      // leave idle rows holding their slots until their TTL.
      const toEnd: Array<string> = []
      // Wakes the pass that gives idle rows back (it sleeps while no lease is warm and nothing is to end, D572).
      let wake: Wake = () => {}
      const endLater = (leaseIds: ReadonlyArray<string>) => {
        toEnd.push(...leaseIds)
        wake()
      }
      const endLeases = (leaseIds: ReadonlyArray<string>) =>
        leaseIds.length === 0
          ? Effect.void
          : sql`SELECT capacity_release(ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(leaseIds)}::jsonb)))`.pipe(
              Effect.asVoid,
              Effect.catch(() => Effect.sync(() => endLater(leaseIds)))
            )
      const endPending = (more: ReadonlyArray<string>) =>
        Effect.suspend(() => endLeases([...toEnd.splice(0), ...more]))
      // After a gap in this instance's heartbeat a survivor may have released its rows (D557): the idle leases
      // written before the gap go (their deletes are harmless if so), and none of them is kept or reused.
      const dropUnsteady = (nowMs: number) => {
        const stale = warm.standSince(instances.steadySince(nowMs))
        if (stale.length > 0) endLater(stale)
      }

      // The lease row and its release are one uninterruptible step (acquireReleaseLean, D465): a caller
      // hanging up while the row is being written still leaves a registered release behind it. Released, a
      // lease goes back warm when its settling statement left its row (`endsWith`), else its row is deleted
      // unless that statement did (`handOff`).
      const holdSlot = (key: string, take: Effect.Effect<WarmLease | undefined>) =>
        acquireReleaseLean(
          Effect.tap(take, (held) =>
            Effect.sync(() => {
              if (held !== undefined) inFlight.set(key, (inFlight.get(key) ?? 0) + 1)
            })
          ),
          (held) => {
            if (held === undefined) return Effect.void
            inFlight.set(key, Math.max(0, (inFlight.get(key) ?? 1) - 1))
            const slot = slots.get(held)
            slots.delete(held)
            return Effect.flatMap(elapsedNow, (nowMs) => {
              if (slot?.warm === true && warm.put(key, held, nowMs)) {
                wake()
                return Effect.void
              }
              if (slot?.warm !== true && slot?.handedOff === true) return Effect.void
              return endLeases([held.leaseId])
            })
          }
        ).pipe(Effect.map((held) => (held === undefined ? undefined : slotOf(held))))

      // What a held lease's settlement decided: kept warm (its statement left the row), or handed off.
      const slots = new WeakMap<WarmLease, { warm: boolean; handedOff: boolean }>()
      const slotOf = (held: WarmLease): Slot => {
        const state = { warm: false, handedOff: false }
        slots.set(held, state)
        return {
          leaseId: held.leaseId,
          endsWith: () => {
            const nowMs = elapsedMs()
            dropUnsteady(nowMs)
            state.warm = warm.wouldKeep(held, nowMs)
            return state.warm ? undefined : held.leaseId
          },
          handOff: () => {
            state.handedOff = true
          }
        }
      }

      // Leases passed over on the way are deleted by the next trim pass, not on the request's path.
      const takeWarm = (key: string, capacity: number) =>
        Effect.map(elapsedNow, (nowMs) => {
          dropUnsteady(nowMs)
          return warm.take(key, capacity, nowMs, (leaseId) => endLater([leaseId]))
        })

      const acquireSlot = (quote: SignedQuote) => {
        const key = slotKey(quote.provider_id, quote.model_class)
        const take = Effect.flatMap(takeWarm(key, quote.capacity_rps), (held) => {
          if (held !== undefined) return Effect.succeed(held)
          const lease = leaseRequestOf(quote)
          return Effect.map(
            sql<{ granted: boolean }>`SELECT ${acquireCapacity(sql, lease)} AS granted`.pipe(Effect.orDie),
            (rows) =>
              rows[0]?.granted === true
                ? { leaseId: lease.leaseId, capacity: lease.capacity, takenAt: lease.requestedAt }
                : undefined
          )
        })
        return holdSlot(key, take).pipe(
          Effect.flatMap((slot) =>
            slot === undefined
              ? Effect.fail(capacityExhausted(quote.provider_id, quote.model_class))
              : Effect.succeed(slot)
          ),
          traced("QuoteBook.acquireSlot")
        )
      }

      const adoptSlot = (lease: LeaseRequest) =>
        Effect.map(
          holdSlot(
            slotKey(lease.providerId, lease.modelClass),
            Effect.succeed({ leaseId: lease.leaseId, capacity: lease.capacity, takenAt: lease.requestedAt })
          ),
          (slot) => slot!
        )

      const hasWarm = (quote: SignedQuote) => {
        const nowMs = elapsedMs()
        dropUnsteady(nowMs)
        return warm.has(slotKey(quote.provider_id, quote.model_class), quote.capacity_rps, nowMs)
      }

      yield* sync
      yield* repeatInBackground(sync, {
        every: "1 second",
        failure: "quote book sync failed",
        level: "warning"
      })
      // Idle leases go back to every instance a moment after their last request; all of them at shutdown,
      // after the requests (which may still put theirs back) and before the database closes.
      wake = yield* passWhenWoken(
        Effect.flatMap(elapsedNow, (nowMs) => {
          dropUnsteady(nowMs)
          return endPending(warm.idle(nowMs))
        }),
        {
          every: "100 millis",
          pending: () => warm.size > 0 || toEnd.length > 0,
          failure: "warm capacity leases were not given back",
          level: "warning"
        }
      )
      yield* Effect.addFinalizer(() => Effect.suspend(() => endPending(warm.drain())))

      return QuoteBook.of({ ingest, live, acquireSlot, adoptSlot, hasWarm, sync })
    })
  )

  /**
   * An in-memory book of the given quotes (already verified): `live` lists them, `acquireSlot` holds
   * their signed capacity in this process only. For tests of what reads the book.
   */
  static readonly layerTest = (quotes: ReadonlyArray<SignedQuote>) =>
    Layer.sync(QuoteBook, () => {
      const inFlight = new Map<string, number>()
      const hold = (providerId: string, modelClass: string, leaseId: string) =>
        Effect.gen(function* () {
          const key = slotKey(providerId, modelClass)
          inFlight.set(key, (inFlight.get(key) ?? 0) + 1)
          yield* Effect.addFinalizer(() => Effect.sync(() => inFlight.set(key, (inFlight.get(key) ?? 1) - 1)))
          return { leaseId, endsWith: () => leaseId, handOff: () => {} } satisfies Slot
        })
      const byId = [...quotes].sort((a, b) =>
        a.quote_id < b.quote_id ? -1 : a.quote_id > b.quote_id ? 1 : 0
      )
      return QuoteBook.of({
        ingest: () => Effect.die("QuoteBook.layerTest does not ingest"),
        live: Effect.sync(() =>
          byId.map((quote) => ({
            quote,
            inFlight: inFlight.get(slotKey(quote.provider_id, quote.model_class)) ?? 0
          }))
        ),
        acquireSlot: (quote) =>
          Effect.gen(function* () {
            const held = inFlight.get(slotKey(quote.provider_id, quote.model_class)) ?? 0
            if (held >= quote.capacity_rps)
              return yield* capacityExhausted(quote.provider_id, quote.model_class)
            return yield* hold(quote.provider_id, quote.model_class, `test-${crypto.randomUUID()}`)
          }),
        adoptSlot: (lease) => hold(lease.providerId, lease.modelClass, lease.leaseId),
        hasWarm: () => false,
        sync: Effect.void
      })
    })
}
