/**
 * The soak's books, kept apart from the router's own reconciliation: what the clients signed and were
 * served, what the ledger recorded, and what the chain moved, held to each other.
 *
 * - Every `exact` authorization a client signed: if its nonce is used on chain, its value is charged,
 *   refunded (paid or credited) or still owed, to the base unit; if it is not, nothing was refunded on it
 *   and nothing was charged that was never paid.
 * - Every payer's token transfers (chain logs) equal what the ledger says landed and was refunded; the
 *   treasury's balance moved by settled − refunded − paid out; the router signer's did not move.
 * - Every wallet holds what it was given (deposits, credited refunds) less its keys' charges and its
 *   withdrawals, and each key's spent is the sum of its charges (a session it funded: the session's spent).
 * - Every `upto` permit settled exactly its request's metered charge, never above the signed ceiling, and
 *   nothing was refunded on it.
 * - Every plan (`x-routing-agent-id`) but a session's was charged at most once: an `Idempotency-Key` sent
 *   again after a hang-up or beside the first call replays or is refused, never charged twice.
 * - Every session's spent is the sum of its calls' charges and never above its budget; none is left open.
 * - An instance drained by SIGTERM left nothing reserved, no capacity lease, and a receipt stored for every
 *   call it charged (`drained`, read the moment it exited; how many were still unsigned is shown).
 */
import { Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { SqlClient as Sql } from "effect/sql"
import { type Address, getAddress, type Hex, type PublicClient, parseAbiItem } from "viem"
import { testUsdcAbi } from "../../src/chain/artifacts.ts"
import { PERMIT2_ADDRESS } from "../../src/chain/Permit2.ts"
import { permit2Abi } from "../../src/chain/permit2Artifact.ts"
import { nonceBitmapPosition } from "../../src/chain/UptoPermit.ts"
import { permit2NonceOf } from "../../src/ledger/Reserve.ts"
import type { FundedKey } from "../support/CreditKeys.ts"
import type { SignedAuthorization } from "./Traffic.ts"

type Query = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) => Promise<A>

const rows = <A extends object>(statement: string, params: ReadonlyArray<unknown> = []) =>
  Effect.gen(function* () {
    const sql = yield* Sql.SqlClient
    return yield* sql.unsafe<A>(statement, params as Array<unknown>)
  })

export interface OpenWork {
  readonly reserved: number
  readonly leases: number
  readonly authorizations: number
  readonly refunds: number
  readonly payouts: number
  readonly outgoing: number
  readonly idempotency: number
  readonly epochsOpen: number
  readonly receiptsNotFinal: number
  readonly sessionsOpen: number
}

export const openWork = async (query: Query): Promise<OpenWork> => {
  const [row] = await query(
    rows<OpenWork>(`
      SELECT
        (SELECT count(*) FROM requests WHERE status = 'reserved')::int AS reserved,
        (SELECT count(*) FROM capacity_leases)::int AS leases,
        (SELECT count(*) FROM x402_authorizations WHERE status IN ('reserved', 'pending', 'submitted'))::int
          AS authorizations,
        (SELECT count(*) FROM refunds WHERE status IN ('due', 'paying'))::int AS refunds,
        (SELECT count(*) FROM provider_payouts WHERE status = 'paying')::int AS payouts,
        (SELECT count(*) FROM outgoing_transactions WHERE status IN ('signed', 'broadcast'))::int AS outgoing,
        (SELECT count(*) FROM idempotency_keys WHERE state = 'in_progress')::int AS idempotency,
        (SELECT count(DISTINCT r.epoch_id) FROM receipts r LEFT JOIN epochs e ON e.epoch_id = r.epoch_id
          WHERE e.status IS DISTINCT FROM 'closed')::int AS "epochsOpen",
        (SELECT count(*) FROM receipts WHERE NOT final)::int AS "receiptsNotFinal",
        (SELECT count(*) FROM sessions WHERE status = 'open')::int AS "sessionsOpen"
    `)
  )
  return row!
}

export const isSettled = (open: OpenWork) => Object.values(open).every((n) => n === 0)

export interface Balances {
  readonly of: ReadonlyMap<string, bigint>
}

export const balances = async (client: PublicClient, token: Address, accounts: ReadonlyArray<string>) => {
  const of = new Map<string, bigint>()
  for (const account of accounts) {
    const value = (await client.readContract({
      address: token,
      abi: testUsdcAbi,
      functionName: "balanceOf",
      args: [getAddress(account)]
    })) as bigint
    of.set(account.toLowerCase(), value)
  }
  return { of } satisfies Balances
}

export interface Money {
  /** Base units a payer gave that are neither charged, refunded nor still owed. */
  readonly lost: bigint
  /** Base units given back or credited beyond what was received, or charged twice. */
  readonly doubleSpent: bigint
  /** Charged for a call whose payment never moved on chain. */
  readonly unpaidCharges: bigint
  /** Where the ledger's record of a transfer and the chain's disagree. */
  readonly ledgerVsChain: bigint
  /** Outgoing transactions of one sender that share a nonce, settlement nonces used twice. */
  readonly nonceReuse: number
  /** Authorizations the ledger holds that no client signed. */
  readonly unknownAuthorizations: number
  /** Calls a client saw served (a request id) that the ledger does not know. */
  readonly unknownRequests: number
  /** Whole answers the ledger holds no charge for. */
  readonly servedFree: number
  readonly servedFreeIds: ReadonlyArray<string>
  /** `upto` permits settled at other than their metered charge, or charged above their signed ceiling. */
  readonly uptoMismatch: number
  /** `upto` permits that settled (landed), of those signed. */
  readonly uptoSettled: number
  /** Plans (an idempotent pair counts once) charged more than once, and the base units beyond the first. */
  readonly chargedTwice: number
  readonly chargedTwiceUnits: bigint
  /** Sessions whose spent is not the sum of their charges or is above their budget. */
  readonly sessionMismatch: number
  /** Sessions opened, and their turns captured. */
  readonly sessions: number
  readonly sessionTurns: number
  readonly notes: ReadonlyArray<string>
}

/** What an instance drained by SIGTERM left behind, read the moment it exited. */
export interface Drained {
  readonly instance: string
  readonly stopped: boolean
  readonly admitted: number
  readonly reserved: number
  readonly leases: number
  /** Calls it charged with no receipt stored. */
  readonly withoutReceipt: number
  /** Receipts stored unsigned (signed once final: x402 ones after their payment lands; a sweep signs what a stopped instance left). */
  readonly unsigned: number
}

export const drained = async (query: Query): Promise<Drained | undefined> => {
  const [row] = await query(
    rows<Drained>(`
      WITH i AS (SELECT instance_id, stopped_at FROM router_instances
                 ORDER BY stopped_at DESC NULLS LAST, heartbeat_at LIMIT 1)
      SELECT i.instance_id AS instance, i.stopped_at IS NOT NULL AS stopped,
        (SELECT count(*) FROM requests q WHERE q.instance_id = i.instance_id)::int AS admitted,
        (SELECT count(*) FROM requests q WHERE q.instance_id = i.instance_id AND q.status = 'reserved')::int AS reserved,
        (SELECT count(*) FROM capacity_leases l WHERE l.instance_id = i.instance_id)::int AS leases,
        (SELECT count(*) FROM requests q LEFT JOIN receipts r ON r.request_id = q.request_id
         WHERE q.instance_id = i.instance_id AND q.status = 'captured' AND r.request_id IS NULL)::int
          AS "withoutReceipt",
        (SELECT count(*) FROM requests q JOIN receipts r ON r.request_id = q.request_id
         WHERE q.instance_id = i.instance_id AND r.signature IS NULL)::int AS unsigned
      FROM i
    `)
  )
  return row
}

interface AuthorizationRow {
  readonly payer: string
  readonly nonce: string
  readonly value: string
  readonly scheme: string
  readonly ceiling: string | null
  readonly status: string
  readonly request_status: string
  readonly charged: string
  readonly refund: string
  readonly refund_status: string | null
}

const transferEvent = parseAbiItem("event Transfer(address indexed from, address indexed to, uint256 value)")
const ZERO = "0x0000000000000000000000000000000000000000"

export const audit = async (options: {
  readonly query: Query
  readonly client: PublicClient
  readonly token: Address
  readonly treasury: Address
  readonly routerSigner: Address
  readonly signed: ReadonlyArray<SignedAuthorization>
  readonly keys: ReadonlyArray<FundedKey>
  readonly requestIdsSeen: ReadonlyArray<string>
  readonly requestIdsServedWhole: ReadonlyArray<string>
  /** Plans that must have been charged at most once (all but sessions). */
  readonly singlePlans: ReadonlyArray<number>
  readonly before: Balances
}): Promise<Money> => {
  const { query, client, token } = options
  const notes: Array<string> = []
  let lost = 0n
  let doubleSpent = 0n
  let unpaidCharges = 0n
  let ledgerVsChain = 0n
  const note = (line: string) => {
    if (notes.length < 12) notes.push(line)
  }

  // 1. Every signed authorization against the ledger and the chain.
  const ledger = new Map<string, AuthorizationRow>()
  for (const row of await query(
    rows<AuthorizationRow>(`
      SELECT lower(a.payer) AS payer, lower(a.nonce) AS nonce, a.value::text AS value, a.scheme,
             a.ceiling::text AS ceiling, a.status, q.status AS request_status,
             -- A session's funding authorization pays for every call of the session: its spent.
             (CASE WHEN s.session_id IS NULL THEN coalesce(q.charged, 0) ELSE s.spent END)::text AS charged,
             coalesce(f.amount, 0)::text AS refund, f.status AS refund_status
      FROM x402_authorizations a
      JOIN requests q ON q.request_id = a.request_id
      LEFT JOIN sessions s ON s.funding_request_id = a.request_id AND s.status <> 'open'
      LEFT JOIN refunds f ON f.request_id = a.request_id
    `)
  )) {
    ledger.set(`${row.payer}:${row.nonce}`, row)
  }
  const signedKeys = new Set(options.signed.map((s) => `${s.payer}:${s.nonce}`))
  const unknownAuthorizations = [...ledger.keys()].filter((k) => !signedKeys.has(k)).length
  const used = await usedNonces(client, token, options.signed)
  let uptoMismatch = 0
  let uptoSettled = 0
  for (const s of options.signed) {
    const row = ledger.get(`${s.payer}:${s.nonce}`)
    const onChain = used.get(`${s.payer}:${s.nonce}`) === true
    if (row === undefined) {
      if (onChain) {
        lost += s.value
        note(`settled on chain, unknown to the ledger: ${s.payer} nonce ${s.nonce.slice(0, 12)}… ${s.value}`)
      }
      continue
    }
    const charged = row.request_status === "captured" ? BigInt(row.charged) : 0n
    const refund = BigInt(row.refund)
    const refunded = row.refund_status === "paid" || row.refund_status === "credited" ? refund : 0n
    const owed =
      (row.refund_status === "due" || row.refund_status === "paying" ? refund : 0n) +
      (row.request_status === "reserved" ? s.value : 0n)
    if (onChain !== (row.status === "landed")) {
      ledgerVsChain += s.value
      note(`nonce ${s.nonce.slice(0, 12)}…: ledger ${row.status}, chain ${onChain ? "used" : "unused"}`)
    }
    if (s.scheme === "upto") {
      // Settled at exactly the metered charge (the ledger's value; the payer's Transfer logs below hold
      // the ledger's values to the chain), never above the signed ceiling, nothing refunded.
      const settled = onChain ? BigInt(row.value) : 0n
      if (onChain) uptoSettled++
      if (charged > s.value || BigInt(row.value) > s.value || BigInt(row.ceiling ?? "0") !== s.value) {
        uptoMismatch++
        note(
          `upto ${s.nonce.slice(0, 20)}…: charged ${charged}, value ${row.value}, ceiling ${row.ceiling} of ${s.value}`
        )
      }
      if (onChain && settled !== charged) {
        uptoMismatch++
        if (settled > charged) doubleSpent += settled - charged
        else unpaidCharges += charged - settled
        note(`upto ${s.nonce.slice(0, 20)}…: settled ${settled}, metered charge ${charged}`)
      }
      if (!onChain && charged > 0n) {
        unpaidCharges += charged
        note(`upto ${s.nonce.slice(0, 20)}…: charged ${charged}, nothing settled (${row.status})`)
      }
      if (refund > 0n) {
        doubleSpent += refund
        note(`upto ${s.nonce.slice(0, 20)}…: a refund of ${refund}`)
      }
      continue
    }
    if (onChain) {
      const rest = s.value - charged - refunded - owed
      if (rest > 0n) {
        lost += rest
        note(`${s.payer} nonce ${s.nonce.slice(0, 12)}…: ${rest} of ${s.value} not charged, refunded or owed`)
      } else if (rest < 0n) {
        doubleSpent -= rest
        note(`${s.payer} nonce ${s.nonce.slice(0, 12)}…: ${-rest} beyond ${s.value} charged+refunded`)
      }
    } else {
      if (refunded > 0n) {
        doubleSpent += refunded
        note(`${s.payer} nonce ${s.nonce.slice(0, 12)}…: refunded ${refunded} of a payment never received`)
      }
      if (charged > 0n) {
        unpaidCharges += charged
        note(`${s.payer} nonce ${s.nonce.slice(0, 12)}…: charged ${charged}, the payment never moved`)
      }
    }
  }

  // 2. Each payer's transfers on chain against the ledger; the treasury's and router signer's balances.
  const payers = [...new Set(options.signed.map((s) => s.payer))]
  const [perPayer] = await Promise.all([
    query(
      rows<{ payer: string; landed: string; refunded: string; credited: string }>(
        `
        SELECT p.payer,
          coalesce((SELECT sum(value) FROM x402_authorizations a
                    WHERE lower(a.payer) = p.payer AND a.status = 'landed'), 0)::text AS landed,
          coalesce((SELECT sum(amount) FROM refunds f WHERE lower(f.payer) = p.payer AND f.status = 'paid'), 0)::text
            AS refunded
        FROM unnest($1::text[]) AS p(payer)
      `,
        [payers]
      )
    )
  ])
  const logs = await client.getLogs({
    address: token,
    event: transferEvent,
    fromBlock: 0n,
    toBlock: "latest"
  })
  const out = new Map<string, bigint>()
  const into = new Map<string, bigint>()
  for (const log of logs) {
    const from = (log.args.from as string).toLowerCase()
    const to = (log.args.to as string).toLowerCase()
    const value = log.args.value as bigint
    if (from === ZERO) continue // the mints that funded the demo wallets
    out.set(from, (out.get(from) ?? 0n) + value)
    into.set(to, (into.get(to) ?? 0n) + value)
  }
  const after = await balances(client, token, [...payers, options.treasury, options.routerSigner])
  for (const row of perPayer) {
    const paidOnChain = out.get(row.payer) ?? 0n
    const refundedOnChain = into.get(row.payer) ?? 0n
    const gap = (what: string, ledgerSays: bigint, chainSays: bigint) => {
      if (ledgerSays === chainSays) return
      ledgerVsChain += ledgerSays > chainSays ? ledgerSays - chainSays : chainSays - ledgerSays
      note(`${row.payer}: ${what} ledger ${ledgerSays}, chain ${chainSays}`)
    }
    gap("paid", BigInt(row.landed), paidOnChain)
    if (refundedOnChain > BigInt(row.refunded)) {
      doubleSpent += refundedOnChain - BigInt(row.refunded)
      note(`${row.payer}: refunded on chain ${refundedOnChain}, ledger ${row.refunded}`)
    } else gap("refunded", BigInt(row.refunded), refundedOnChain)
    const start = options.before.of.get(row.payer) ?? 0n
    gap("balance", start - BigInt(row.landed) + BigInt(row.refunded), after.of.get(row.payer) ?? 0n)
  }
  const [treasury] = await query(
    rows<{ settled: string; refunded: string; paid_out: string }>(`
      SELECT coalesce((SELECT sum(value) FROM x402_authorizations WHERE status = 'landed'), 0)::text AS settled,
             coalesce((SELECT sum(amount) FROM refunds WHERE status = 'paid'), 0)::text AS refunded,
             coalesce((SELECT sum(amount) FROM provider_payouts WHERE status = 'paid'), 0)::text AS paid_out
    `)
  )
  const treasuryKey = options.treasury.toLowerCase()
  const expectedTreasury =
    (options.before.of.get(treasuryKey) ?? 0n) +
    BigInt(treasury!.settled) -
    BigInt(treasury!.refunded) -
    BigInt(treasury!.paid_out)
  const actualTreasury = after.of.get(treasuryKey) ?? 0n
  if (expectedTreasury !== actualTreasury) {
    const d = expectedTreasury - actualTreasury
    ledgerVsChain += d < 0n ? -d : d
    note(`treasury: ledger says ${expectedTreasury}, chain holds ${actualTreasury}`)
  }
  const signerKey = options.routerSigner.toLowerCase()
  if (signerKey !== treasuryKey && options.before.of.get(signerKey) !== after.of.get(signerKey)) {
    const d = (options.before.of.get(signerKey) ?? 0n) - (after.of.get(signerKey) ?? 0n)
    ledgerVsChain += d < 0n ? -d : d
    note(`router signer's token balance moved by ${-d}`)
  }

  // 3. Every wallet's balance (available + reserved) is what it was given (deposits that landed, refunds
  //    credited below the payout floor) less what its keys were charged and it withdrew; each key's spent
  //    is the sum of its captured charges and its reserved what its open requests hold. Read through
  //    `balance_figures` and `key_figures`: the rows with the captures not yet folded counted (D315).
  for (const row of await query(
    rows<{ wallet: string; held: string; given: string; taken: string }>(`
      SELECT w.wallet, (w.available + w.reserved)::text AS held,
        (coalesce((SELECT sum(amount) FROM refunds f WHERE lower(f.payer) = w.wallet AND f.status = 'credited'), 0) +
         coalesce((SELECT sum(amount) FROM deposits d WHERE lower(d.wallet) = w.wallet AND d.status = 'credited'), 0)
        )::text AS given,
        (coalesce((SELECT sum(charged) FROM requests q
                   WHERE q.payment_kind = 'credit' AND lower(q.payer) = w.wallet AND q.status = 'captured'
                     AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.funding_request_id = q.request_id)), 0) +
         coalesce((SELECT sum(spent) FROM sessions s
                   WHERE s.funding_kind = 'credit' AND lower(s.payer) = w.wallet AND s.status <> 'open'), 0) +
         coalesce((SELECT sum(amount) FROM withdrawals x WHERE lower(x.wallet) = w.wallet AND x.status <> 'failed'), 0)
        )::text AS taken
      FROM (SELECT lower(wallet) AS wallet, available, reserved FROM balance_figures) w
    `)
  )) {
    const rest = BigInt(row.given) - BigInt(row.taken) - BigInt(row.held)
    if (rest > 0n) {
      lost += rest
      note(`wallet ${row.wallet}: ${rest} of what it was given neither held, charged nor withdrawn`)
    } else if (rest < 0n) {
      doubleSpent -= rest
      note(`wallet ${row.wallet}: holds ${-rest} beyond what it was given less charges`)
    }
  }
  const keyRows = await query(
    rows<{ key_id: string; spent: string; reserved: string; charged: string; held: string }>(`
      SELECT k.key_id, k.spent::text AS spent, k.reserved::text AS reserved,
        (coalesce((SELECT sum(charged) FROM requests q WHERE q.key_id = k.key_id AND q.status = 'captured'
                    AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.funding_request_id = q.request_id)), 0) +
         coalesce((SELECT sum(spent) FROM sessions s WHERE s.key_id = k.key_id AND s.status <> 'open'), 0))::text
          AS charged,
        coalesce((SELECT sum(authorized) FROM requests q WHERE q.key_id = k.key_id AND q.status = 'reserved'), 0)::text
          AS held
      FROM key_figures k
    `)
  )
  for (const key of options.keys) {
    const row = keyRows.find((k) => k.key_id === key.keyId)
    if (row === undefined) {
      note(`key ${key.keyId} is missing`)
      continue
    }
    const spent = BigInt(row.spent)
    const charged = BigInt(row.charged)
    if (spent > charged) doubleSpent += spent - charged
    if (spent < charged) lost += charged - spent
    if (spent !== charged || BigInt(row.reserved) !== BigInt(row.held))
      note(
        `key ${key.keyId}: spent ${spent} vs charged ${charged}; reserved ${row.reserved} vs held ${row.held}`
      )
  }

  // 4. Nonces used twice (one sender's outgoing transactions) and calls the ledger does not know.
  const [reuse] = await query(
    rows<{ n: number }>(`
      SELECT count(*)::int AS n FROM (
        SELECT sender, nonce FROM outgoing_transactions WHERE status = 'mined'
        GROUP BY sender, nonce HAVING count(*) > 1
      ) twice
    `)
  )
  const seen = [...new Set(options.requestIdsSeen)]
  const charged = new Map(
    (
      await query(
        rows<{ request_id: string; charged: string }>(
          `SELECT request_id, coalesce(charged, 0)::text AS charged FROM requests
           WHERE request_id = ANY($1::text[]) AND status = 'captured'`,
          [seen]
        )
      )
    ).map((r) => [r.request_id, BigInt(r.charged)])
  )
  const known = new Set(
    (
      await query(
        rows<{ request_id: string }>("SELECT request_id FROM requests WHERE request_id = ANY($1::text[])", [
          seen
        ])
      )
    ).map((r) => r.request_id)
  )
  const unknownRequests = seen.filter((id) => !known.has(id)).length
  // A whole answer was served: the ledger captured a charge for it (a release would serve it free).
  const servedFree = [...new Set(options.requestIdsServedWhole)].filter(
    (id) => (charged.get(id) ?? 0n) === 0n
  )
  for (const id of servedFree.slice(0, 3)) note(`${id}: a whole answer, captured no charge`)

  // 5. At most one charge per plan (an idempotent pair is one plan; a session's calls are excluded).
  const twice = await query(
    rows<{ agent: string; n: number; extra: string }>(
      `SELECT agent->>'agent_id' AS agent, count(*)::int AS n,
              (sum(charged) - min(charged))::text AS extra
       FROM requests WHERE status = 'captured' AND charged > 0 AND agent->>'agent_id' = ANY($1::text[])
       GROUP BY 1 HAVING count(*) > 1`,
      [options.singlePlans.map((id) => `soak-${id}`)]
    )
  )
  let chargedTwiceUnits = 0n
  for (const row of twice) {
    chargedTwiceUnits += BigInt(row.extra)
    note(`plan ${row.agent}: charged ${row.n} times`)
  }
  doubleSpent += chargedTwiceUnits

  // 6. Sessions: spent = the sum of their calls' charges, never above the budget.
  const sessions = await query(
    rows<{
      session_id: string
      budget: string
      spent: string
      charged: string
      turns: number
      status: string
    }>(`
      SELECT s.session_id, s.budget::text AS budget, s.spent::text AS spent, s.status,
        (SELECT count(*) FROM requests q WHERE q.session_id = s.session_id AND q.status = 'captured'
           AND q.request_id <> s.funding_request_id)::int AS turns,
        coalesce((SELECT sum(charged) FROM requests q WHERE q.session_id = s.session_id AND q.status = 'captured'), 0)::text
          AS charged
      FROM sessions s
    `)
  )
  let sessionMismatch = 0
  for (const row of sessions) {
    if (row.spent !== row.charged || BigInt(row.spent) > BigInt(row.budget)) {
      sessionMismatch++
      note(
        `session ${row.session_id}: spent ${row.spent}, its calls charged ${row.charged}, budget ${row.budget}`
      )
    }
  }
  return {
    uptoMismatch,
    uptoSettled,
    chargedTwice: twice.length,
    chargedTwiceUnits,
    sessionMismatch,
    sessions: sessions.length,
    sessionTurns: sessions.reduce((n, s) => n + s.turns, 0),
    lost,
    doubleSpent,
    unpaidCharges,
    ledgerVsChain,
    nonceReuse: reuse?.n ?? 0,
    unknownAuthorizations,
    unknownRequests,
    servedFree: servedFree.length,
    servedFreeIds: servedFree,
    notes
  }
}

/** EIP-3009 `authorizationState` of each signed nonce, read a few at a time. */
const usedNonces = async (
  client: PublicClient,
  token: Address,
  signed: ReadonlyArray<SignedAuthorization>
) => {
  const used = new Map<string, boolean>()
  const queue = [...signed]
  const worker = async () => {
    for (let s = queue.pop(); s !== undefined; s = queue.pop()) {
      let state: boolean
      if (s.scheme === "upto") {
        const { wordPos, bitPos } = nonceBitmapPosition(permit2NonceOf(s.nonce))
        const word = (await client.readContract({
          address: PERMIT2_ADDRESS,
          abi: permit2Abi,
          functionName: "nonceBitmap",
          args: [getAddress(s.payer), wordPos]
        })) as bigint
        state = ((word >> bitPos) & 1n) === 1n
      } else
        state = (await client.readContract({
          address: token,
          abi: testUsdcAbi,
          functionName: "authorizationState",
          args: [getAddress(s.payer), s.nonce as Hex]
        })) as boolean
      used.set(`${s.payer}:${s.nonce}`, state)
    }
  }
  await Promise.all(Array.from({ length: 8 }, worker))
  return used
}
