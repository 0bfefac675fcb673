/** How long a read of a payer's funds vouches for its next calls, and how many payers are remembered (D543). */
const VOUCH_MS = 60_000
const SEEN_PAYERS = 10_000

/**
 * The funds the chain last showed for each payer (by whatever key the caller gives: scheme and payer), and
 * when: a payer whose funds covered a value within the last minute is vouched for, and its x402 call may
 * reserve before the chain's reads answer (D543). Oldest first; the oldest goes when the map is full. Only
 * the chain's own answers go in.
 */
export const fundsSeen = () => {
  const lastRead = new Map<string, { readonly funds: bigint; readonly atMs: number }>()
  return {
    remember: (key: string, funds: bigint, nowMs: number) => {
      lastRead.delete(key)
      lastRead.set(key, { funds, atMs: nowMs })
      if (lastRead.size > SEEN_PAYERS) lastRead.delete(lastRead.keys().next().value!)
    },
    vouches: (key: string, value: bigint, nowMs: number) => {
      const read = lastRead.get(key)
      return read !== undefined && nowMs - read.atMs <= VOUCH_MS && read.funds >= value
    }
  }
}
