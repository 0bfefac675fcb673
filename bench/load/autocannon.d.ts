// The part of autocannon's API the load benchmark uses (the package ships no types).
declare module "autocannon" {
  interface Options {
    readonly url: string
    readonly method?: string
    readonly connections?: number
    readonly duration?: number
    readonly timeout?: number
    readonly headers?: Record<string, string>
    readonly body?: string
  }
  interface Histogram {
    readonly average: number
    readonly p50: number
    readonly p99: number
    readonly total: number
  }
  interface Result {
    readonly requests: Histogram
    readonly latency: Histogram
    readonly non2xx: number
    readonly errors: number
    readonly timeouts: number
  }
  function autocannon(options: Options): Promise<Result>
  export default autocannon
}
