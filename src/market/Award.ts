/**
 * The award step (pure): each eligible quote is scored (its own cost times the profile's multiplier
 * for quality and measured latency), the profile's restriction applies (`best`'s quality band, the
 * deadline mechanism's cheapest feasible class), and bids are ranked with one bid per provider.
 *
 * An auction looks at every live quote (1,000 and more), so the candidates are parallel arrays of
 * numbers, not an object per quote (D280): a score is computed once and compared as a number, each
 * provider keeps its best quote in one pass, and only the bids (one per provider) are sorted, by a
 * packed numeric key (D281). Objects are made only for what the outcome shows: bids and exclusions.
 */
import type { ExclusionReason } from "./AuctionRecords.ts"
import type { Candidates } from "./Candidates.ts"

/** The first candidate of `among` in the total order, or -1. */
export const firstOf = (candidates: Candidates, among: (i: number) => boolean): number => {
  let best = -1
  for (let i = 0; i < candidates.n; i++)
    if (among(i) && (best < 0 || candidates.compare(i, best) < 0)) best = i
  return best
}

/**
 * The profile's restriction: `best` keeps the top quality band, `deadline-price/1` the class of the
 * cheapest feasible quote. Returns the reason for the dropped and whether candidate `i` stays, or
 * undefined when the profile keeps every candidate.
 */
export const profileRestriction = (
  candidates: Candidates,
  deadline: boolean,
  band: number | undefined
): { readonly keep: (i: number) => boolean; readonly reason: ExclusionReason } | undefined => {
  if (deadline) {
    // Under deadline-price the profile is `cheapest`, so score order is cost order.
    const cheapest = firstOf(candidates, () => true)
    const cheapestClass = cheapest < 0 ? undefined : candidates.termsOf(cheapest).modelClass.id
    return {
      keep: (i) => candidates.termsOf(i).modelClass.id === cheapestClass,
      reason: "class_not_selected"
    }
  }
  if (band === undefined) return undefined
  // The quality scored: a task's ratings move the band as they move the score (D232).
  let top = Number.NEGATIVE_INFINITY
  for (let i = 0; i < candidates.n; i++) top = Math.max(top, candidates.termsOf(i).quality)
  return { keep: (i) => candidates.termsOf(i).quality >= top - band - 1e-9, reason: "below_quality_tier" }
}

/**
 * One bid per provider, so a provider never sets its own price: among the candidates `competing`, each
 * provider's first in the total order (the locked quote, when there is one, for its provider); the
 * others are passed to `drop`. Returns the bids in rank order (the locked quote first).
 */
export const rankIndependentBids = (
  candidates: Candidates,
  competing: (i: number) => boolean,
  first: number,
  drop: (i: number) => void
): Int32Array => {
  candidates.numberProviders()
  // Per provider number, its best candidate so far plus one (0: none yet).
  const best = new Int32Array(candidates.providerBound)
  const chosen = new Uint8Array(candidates.n)
  let count = 0
  const firstProvider = first < 0 ? -1 : candidates.provider[first]!
  for (let i = 0; i < candidates.n; i++) {
    if (!competing(i)) continue
    const provider = candidates.provider[i]!
    if (provider === firstProvider) {
      if (i !== first) drop(i)
      continue
    }
    const held = best[provider]! - 1
    if (held < 0) {
      best[provider] = i + 1
      chosen[i] = 1
      count++
    } else if (candidates.compare(i, held) < 0) {
      drop(held)
      chosen[held] = 0
      best[provider] = i + 1
      chosen[i] = 1
    } else drop(i)
  }
  const ids = new Int32Array(count)
  for (let i = 0, k = 0; k < count; i++) if (chosen[i] === 1) ids[k++] = i
  const others = sortCandidates(candidates, ids)
  if (first < 0) return others
  const ranked = new Int32Array(others.length + 1)
  ranked[0] = first
  ranked.set(others, 1)
  return ranked
}

/**
 * Candidates in the total order. A score that is a safe integer below 2^(53 - bits) leaves room for the
 * candidate's index in the low bits of one double, so a native numeric sort orders them; runs of equal
 * scores are then put in the full order (own cost, quote id, provider id). Wider scores take the
 * comparator sort.
 */
const sortCandidates = (candidates: Candidates, ids: Int32Array): Int32Array => {
  const count = ids.length
  const slots = 2 ** (32 - Math.clz32(count))
  const limit = Number.MAX_SAFE_INTEGER / slots - 1
  const keys = new Float64Array(count)
  for (let k = 0; k < count; k++) {
    const score = candidates.score[ids[k]!]!
    if (!(score >= 0 && score < limit)) return ids.sort((a, b) => candidates.compare(a, b))
    keys[k] = score * slots + k
  }
  keys.sort()
  const ranked = new Int32Array(count)
  // The index is the key's low bits (key - floor(key / slots) x slots is exact; cheaper than a double's %).
  for (let k = 0; k < count; k++) {
    const key = keys[k]!
    ranked[k] = ids[key - Math.floor(key / slots) * slots]!
  }
  for (let start = 0; start < count; ) {
    const score = candidates.score[ranked[start]!]!
    let end = start + 1
    while (end < count && candidates.score[ranked[end]!] === score) end++
    if (end - start > 1) ranked.subarray(start, end).sort((a, b) => candidates.compare(a, b))
    start = end
  }
  return ranked
}
