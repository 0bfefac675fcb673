/** Per key (a class, a provider), per whole minute: what was added in that minute (D549). */
export type ByMinute<T> = Map<string, Map<number, T>>

/** The entry of `key`'s `minute`, made by `make` the first time. */
export const minuteEntry = <T>(map: ByMinute<T>, key: string, minute: number, make: () => T): T => {
  let byMinute = map.get(key)
  if (byMinute === undefined) {
    byMinute = new Map()
    map.set(key, byMinute)
  }
  let entry = byMinute.get(minute)
  if (entry === undefined) {
    entry = make()
    byMinute.set(minute, entry)
  }
  return entry
}

/** What one provider cleared in a minute, or over the stats window. */
export interface ProviderFigures {
  count: number
  volume: number
  tokens: number
  /** Clears by class. */
  readonly classes: Map<string, number>
}

export const emptyProviderFigures = (): ProviderFigures => ({
  count: 0,
  volume: 0,
  tokens: 0,
  classes: new Map()
})

/** Counts one clear into `into`. */
export const addProviderClear = (
  into: ProviderFigures,
  clear: { readonly modelClass: string; readonly charged: number; readonly tokens: number }
) => {
  into.count += 1
  into.volume += clear.charged
  into.tokens += clear.tokens
  into.classes.set(clear.modelClass, (into.classes.get(clear.modelClass) ?? 0) + 1)
}

/** Takes what `from` counted out of `into` (a minute leaving the stats window). */
export const subtractProviderFigures = (into: ProviderFigures, from: ProviderFigures) => {
  into.count -= from.count
  into.volume -= from.volume
  into.tokens -= from.tokens
  for (const [modelClass, n] of from.classes) {
    const left = (into.classes.get(modelClass) ?? 0) - n
    if (left === 0) into.classes.delete(modelClass)
    else into.classes.set(modelClass, left)
  }
}
