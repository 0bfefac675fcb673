import { Worker } from "node:worker_threads"
import { Effect, Redacted } from "effect"
import type { Hex } from "viem"
import type { ChainShape } from "../chain/Chain.ts"
import { type ReceiptBody, receiptDigest } from "../domain/Receipt.ts"
import type { SignerStart, SignReply, SignRequest } from "./ReceiptSignerWorker.ts"

/** Workers that stop this many times in a row without signing a batch: signing stays on the main thread. */
const CRASHES_BEFORE_IN_THREAD = 3
/** A worker with no batch for this long is let go (its isolate is 33-35 MB of RSS); the next batch starts one. */
const IDLE_STOP_MS = 15_000

interface Running {
  readonly worker: Worker
  /** Each batch sent and not answered: resumed with its signatures, or `undefined` when it cannot be. */
  readonly pending: Map<number, (signatures: ReadonlyArray<Hex> | undefined) => void>
  /** Set while no batch is pending: lets the worker go when it fires. */
  idle: ReturnType<typeof setTimeout> | undefined
  /** Let go for want of work: its exit is not a crash. */
  retired: boolean
  /** Its module has loaded (its first message): until then batches are signed on the main thread. */
  ready: boolean
}

/**
 * Signs receipts off the router's main thread: a worker thread (`ReceiptSignerWorker.ts`) that holds the
 * router signer's key computes each receipt's digest and signature (pure-JS keccak and secp256k1, about
 * 1 ms of CPU a receipt, D390). The bytes are those of `chain.signDigest` (RFC 6979 is deterministic), so
 * a batch the worker cannot sign (it stopped, or the layer is closing) is signed on the main thread
 * instead and no receipt waits on a thread that is gone. A worker that stops is started again on the next
 * batch, up to `CRASHES_BEFORE_IN_THREAD` times in a row.
 *
 * A scoped resource: the worker starts with the first batch, is let go after `IDLE_STOP_MS` without one
 * (D421), and is terminated when the scope closes; what is signed after that is signed on the main thread.
 * Batches that come while it is still loading are signed on the main thread too (D424).
 */
export const makeReceiptSigner = Effect.fnUntraced(function* (
  chain: ChainShape,
  options: { readonly idleStopMs?: number } = {}
) {
  const idleStopMs = options.idleStopMs ?? IDLE_STOP_MS
  let running: Running | undefined
  let closed = false
  let crashes = 0
  let nextId = 0
  /** Why the last worker stopped, until a batch that fell back to the main thread logs it. */
  let stopped: string | undefined

  const start = (): Running | undefined => {
    if (closed || crashes >= CRASHES_BEFORE_IN_THREAD) return undefined
    const key = Buffer.from(Redacted.value(chain.routerKey).slice(2), "hex")
    const worker = new Worker(new URL("./ReceiptSignerWorker.ts", import.meta.url), {
      workerData: { key, chainId: chain.chainId } satisfies SignerStart,
      // Node loads the worker itself (type stripping): none of the parent's loaders or flags.
      execArgv: [],
      // A batch is at most 500 small bodies: V8's default young generation only held 10 MB more RSS (D390).
      resourceLimits: { maxYoungGenerationSizeMb: 4 }
    })
    key.fill(0)
    const self: Running = { worker, pending: new Map(), idle: undefined, retired: false, ready: false }
    let failure: string | undefined
    worker.on("message", (reply: SignReply) => {
      if ("ready" in reply) {
        self.ready = true
        return
      }
      const resume = self.pending.get(reply.id)
      if (resume === undefined) return
      self.pending.delete(reply.id)
      if (self.pending.size === 0) rest(self)
      if ("error" in reply) return resume(undefined)
      crashes = 0
      resume(reply.signatures)
    })
    worker.on("error", (error) => {
      failure = error.message
    })
    worker.on("exit", (code) => {
      if (running === self) running = undefined
      clearTimeout(self.idle)
      if (!closed && !self.retired) {
        crashes++
        stopped = `the receipt signer's worker stopped (exit ${code}${failure === undefined ? "" : `: ${failure}`})`
      }
      const waiting = [...self.pending.values()]
      self.pending.clear()
      for (const resume of waiting) resume(undefined)
    })
    // Only a batch in flight keeps the process up (`ref` while one is pending).
    rest(self)
    running = self
    return self
  }

  /** No batch pending: the process may exit, and the worker is let go if none comes for `IDLE_STOP_MS`. */
  const rest = (self: Running) => {
    self.worker.unref()
    clearTimeout(self.idle)
    self.idle = setTimeout(() => {
      if (self.pending.size > 0) return
      self.retired = true
      if (running === self) running = undefined
      void self.worker.terminate()
    }, idleStopMs)
    self.idle.unref()
  }

  /** A batch is pending: the worker keeps the process up and is not let go. */
  const busy = (self: Running) => {
    clearTimeout(self.idle)
    self.idle = undefined
    self.worker.ref()
  }

  /** The worker's signatures of a batch, or `undefined` when there is no worker to ask or it stopped. */
  const inWorker = (receipts: ReadonlyArray<ReceiptBody>) =>
    Effect.callback<ReadonlyArray<Hex> | undefined>((resume) => {
      const current = running ?? start()
      // A worker still loading (about 170 ms on an idle machine, seconds on a loaded one) is not waited
      // for: the receipts of the first batch after an idle stop are not held back by its start.
      if (current === undefined || !current.ready) return resume(Effect.succeed(undefined))
      const id = nextId++
      if (current.pending.size === 0) busy(current)
      current.pending.set(id, (signatures) => resume(Effect.succeed(signatures)))
      current.worker.postMessage({ id, receipts } satisfies SignRequest)
      return Effect.sync(() => {
        current.pending.delete(id)
        if (current.pending.size === 0) rest(current)
      })
    })

  const inThread = (receipts: ReadonlyArray<ReceiptBody>) =>
    Effect.forEach(receipts, (receipt) => chain.signDigest(receiptDigest(receipt, chain.chainId)))

  /** How many receipts each thread has signed. */
  const signed = { worker: 0, thread: 0 }

  /** The router signer's signatures of `receipts`, in order. */
  const sign = (receipts: ReadonlyArray<ReceiptBody>) =>
    receipts.length === 0
      ? Effect.succeed<ReadonlyArray<Hex>>([])
      : Effect.flatMap(inWorker(receipts), (signatures) => {
          if (signatures !== undefined) {
            signed.worker += receipts.length
            return Effect.succeed(signatures)
          }
          signed.thread += receipts.length
          const why = stopped
          stopped = undefined
          return why === undefined
            ? inThread(receipts)
            : Effect.logWarning(`${why}: signing its batch on the main thread`).pipe(
                Effect.andThen(inThread(receipts))
              )
        })

  // Started by the first batch, not with the scope: a router that has signed nothing (or nothing for
  // `IDLE_STOP_MS`) holds no worker.
  yield* Effect.addFinalizer(() =>
    Effect.promise(async () => {
      closed = true
      if (running !== undefined) clearTimeout(running.idle)
      await running?.worker.terminate()
    })
  )

  return {
    sign,
    /** The worker thread signing now, if any (tests terminate it to stand for a crash). */
    worker: (): Worker | undefined => running?.worker,
    /** Whether the worker has loaded and takes batches. */
    ready: (): boolean => running?.ready === true,
    /** Receipts signed so far by the worker and on the main thread. */
    signed: (): { readonly worker: number; readonly thread: number } => ({ ...signed })
  }
})

export type ReceiptSigner = Effect.Success<ReturnType<typeof makeReceiptSigner>>
