/**
 * The route step (pure): what a request asked for, as the market reads it. An alias (`auto`, `best`,
 * `cheapest`, `fastest`) picks a routing profile over the whole market; a concrete class pins it; a
 * session pins its locked class; `auto` (or a class) with a latency SLO clears by `deadline-price/1`.
 */

export type RoutingProfile = "auto" | "best" | "cheapest" | "fastest"
export const ROUTING_PROFILES: ReadonlyArray<RoutingProfile> = ["auto", "best", "cheapest", "fastest"]
export const isRoutingProfile = (value: string): value is RoutingProfile =>
  (ROUTING_PROFILES as ReadonlyArray<string>).includes(value)

export const MECHANISM_VERSION = "second-score/1"
export const DEADLINE_MECHANISM_VERSION = "deadline-price/1"
export type MechanismVersion = typeof MECHANISM_VERSION | typeof DEADLINE_MECHANISM_VERSION

export interface ProfileWeights {
  /** Score multipliers lie in [10000, premiumCapBps] bps, which bounds what the profile pays over the cheapest. */
  readonly premiumCapBps: number
  readonly qualityWeight: number
  readonly latencyWeight: number
  /** `best` only: candidates are the classes within this much quality of the best eligible class. */
  readonly qualityBand?: number
}

export const PROFILES: Readonly<Record<RoutingProfile, ProfileWeights>> = {
  cheapest: { premiumCapBps: 10_000, qualityWeight: 0, latencyWeight: 0 },
  auto: { premiumCapBps: 11_500, qualityWeight: 0.5, latencyWeight: 0.5 },
  best: { premiumCapBps: 13_000, qualityWeight: 0.6, latencyWeight: 0.4, qualityBand: 0.05 },
  fastest: { premiumCapBps: 12_500, qualityWeight: 0.1, latencyWeight: 0.9 }
}

export interface SloRequest {
  readonly requested: string
  readonly latencySlo?: unknown
  readonly sessionLock?: { readonly modelClass: string } | undefined
}

export interface Route {
  readonly profile: RoutingProfile
  readonly version: MechanismVersion
  /** A pinned class id, or undefined for an alias over the whole market. */
  readonly pinnedClass: string | undefined
}

export const resolveRoute = (request: SloRequest): Route => {
  const alias = isRoutingProfile(request.requested) ? request.requested : undefined
  const pinnedClass = request.sessionLock?.modelClass ?? (alias === undefined ? request.requested : undefined)
  const deadline =
    request.latencySlo !== undefined &&
    request.sessionLock === undefined &&
    (alias === "auto" || alias === undefined)
  if (deadline) return { profile: "cheapest", version: DEADLINE_MECHANISM_VERSION, pinnedClass }
  const profile = request.sessionLock !== undefined || alias === undefined ? "auto" : alias
  return { profile, version: MECHANISM_VERSION, pinnedClass }
}
