/** Per key (a class, a provider), per whole minute or second: what was added in it (D549, D551). */
export type ByKeyAndTime<T> = Map<string, Map<number, T>>

/** The entry of `key`'s minute (or second) `at`, made by `make` the first time. */
export const keyedEntry = <T>(map: ByKeyAndTime<T>, key: string, at: number, make: () => T): T => {
  let byMinute = map.get(key)
  if (byMinute === undefined) {
    byMinute = new Map()
    map.set(key, byMinute)
  }
  let entry = byMinute.get(at)
  if (entry === undefined) {
    entry = make()
    byMinute.set(at, entry)
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
