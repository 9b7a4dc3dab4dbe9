"""Build deploy/grafana/pdd-router.json, the router's Grafana dashboard, with Grafana's own
builder library (grafana-foundation-sdk): panels as code, the JSON regenerated from them.

    pip install grafana-foundation-sdk   # in any venv: only this script needs it
    python deploy/grafana/build_dashboard.py

Every panel reads the router's /metrics (``pdd_router_*``); ``$model`` picks the models
(``pdd_router_requests_total``'s ``model`` label) and ``$datasource`` the Prometheus.
tests/e2e/test_grafana_dashboard.py runs each query of the JSON against a real Prometheus
scraping a real router under load.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphDrawStyle, LegendDisplayMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

OUT = Path(__file__).with_name("pdd-router.json")
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
M = 'model=~"$model"'
RATE = "$__rate_interval"


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def quantiles(metric: str, by: str = "pipeline") -> list[prometheus.Dataquery]:
    """p50 and p99 of a histogram, per ``by``."""
    return [
        query(f"histogram_quantile({q}, sum by (le, {by}) "
              f"(rate({metric}_bucket{{{M}}}[{RATE}])))", f"p{round(q * 100)} {{{{{by}}}}}", ref)
        for q, ref in ((0.5, "A"), (0.99, "B"))
    ]  # fmt: skip


def series(
    title: str, description: str, unit: str, targets: list[prometheus.Dataquery], pos: GridPos
) -> timeseries.Panel:
    panel = (
        timeseries.Panel().title(title).description(description).unit(unit).datasource(DS)
        .grid_pos(pos).draw_style(GraphDrawStyle.LINE).line_width(1).fill_opacity(10)
        .legend(_legend())
    )  # fmt: skip
    for target in targets:
        panel = panel.with_target(target)
    return panel


def _legend() -> object:
    from grafana_foundation_sdk.builders.common import VizLegendOptions

    return VizLegendOptions().display_mode(LegendDisplayMode.TABLE).show_legend(True)


def at(x: int, y: int, w: int = 8, h: int = 8) -> GridPos:
    return GridPos(x=x, y=y, w=w, h=h)


def requests_row(y: int) -> list[timeseries.Panel]:
    return [
        series("Requests by outcome", "Requests that ended per second: a finish reason "
               "(stop, length, tool_calls, abort: the client left) or an error kind "
               "(rejected by admission control, engine_busy, unavailable, engine_error...)",
               "reqps", [query(f"sum by (outcome) (rate(pdd_router_requests_total{{{M}}}"
                               f"[{RATE}]))", "{{outcome}}")], at(0, y)),
        series("In flight and queued", "Requests between arrival and end, and those still "
               "waiting for their first token (deciding, a busy engine, prefill, KV transfer)",
               "short", [query(f"sum by (model) (pdd_router_requests_in_flight{{{M}}})",
                               "in flight {{model}}"),
                         query(f"sum by (model) (pdd_router_requests_queued{{{M}}})",
                               "queued {{model}}", "B")], at(8, y)),
        series("Routing decisions", "Decisions per second by pipeline and handoff mode",
               "reqps", [query(f"sum by (pipeline, handoff) (rate(pdd_router_decisions_total"
                               f"[{RATE}]))", "{{pipeline}} {{handoff}}")], at(16, y)),
    ]  # fmt: skip


def latency_row(y: int) -> list[timeseries.Panel]:
    return [
        series("Time to first token", "From a request's arrival (tokenized) to its first "
               "token, per pipeline", "s", quantiles("pdd_router_ttft_seconds"), at(0, y)),
        series("Inter-token latency", "Between two output tokens as the router relays them",
               "s", quantiles("pdd_router_inter_token_latency_seconds"), at(8, y)),
        series("End-to-end latency", "From arrival to the request's end", "s",
               quantiles("pdd_router_e2e_request_latency_seconds"), at(16, y)),
    ]  # fmt: skip


def tokens_row(y: int) -> list[timeseries.Panel]:
    by = "sum by (pipeline)"
    return [
        series("Token throughput", "Prompt tokens of requests served, and output tokens "
               "relayed, per second", "short",
               [query(f"{by} (rate(pdd_router_prompt_tokens_total{{{M}}}[{RATE}]))",
                      "prompt {{pipeline}}"),
                query(f"{by} (rate(pdd_router_generation_tokens_total{{{M}}}[{RATE}]))",
                      "generation {{pipeline}}", "B")], at(0, y)),
        series("Prefix cache: predicted and reported", "Share of prompt tokens the serving "
               "engine found cached (its usage), and the router's mean predicted hit rate on "
               "the serving decode tier", "percentunit",
               [query(f"sum(rate(pdd_router_prompt_cached_tokens_total{{{M}}}[{RATE}])) / "
                      f"sum(rate(pdd_router_prompt_tokens_total{{{M}}}[{RATE}]))",
                      "reported by engines"),
                query(f"sum(rate(pdd_router_predicted_hit_rate_sum[{RATE}])) / "
                      f"sum(rate(pdd_router_predicted_hit_rate_count[{RATE}]))",
                      "predicted", "B")], at(8, y)),
        series("WAN bytes", "KV bytes the served decisions sent across the WAN, per pipeline",
               "Bps", [query(f"{by} (rate(pdd_router_wan_bytes_total{{{M}}}[{RATE}]))",
                             "{{pipeline}}")], at(16, y)),
    ]  # fmt: skip


def router_row(y: int) -> list[object]:
    degraded = (
        stat.Panel().title("Index degraded").datasource(DS).grid_pos(at(0, y, 4, 6))
        .description("1 while decisions use the local mirror: the shared index is "
                     "unreachable or being brought up to date")
        .with_target(query("max(pdd_router_index_degraded)", "degraded"))
    )  # fmt: skip
    return [
        degraded,
        series("Router overhead and decision time", "The router's own time before a "
               "first token (mean), and the time to decide a request (mean)", "s",
               [query(f"sum(rate(pdd_router_overhead_seconds_sum[{RATE}])) / "
                      f"sum(rate(pdd_router_overhead_seconds_count[{RATE}]))", "overhead"),
                query(f"sum(rate(pdd_router_decision_seconds_sum[{RATE}])) / "
                      f"sum(rate(pdd_router_decision_seconds_count[{RATE}]))", "decision",
                      "B")], at(4, y, 7, 6)),
        series("Handoffs", "RLD to MD handoffs per second by mode", "ops",
               [query(f"sum by (mode) (rate(pdd_router_handoffs_total[{RATE}]))", "{{mode}}")],
               at(11, y, 6, 6)),
        # errors over calls, with instances that had no error at 0 rather than left out
        series("Upstream error ratio", "Failed engine calls over calls, per instance",
               "percentunit",
               [query(f"(sum by (instance) (rate(pdd_router_upstream_errors_total[{RATE}])) "
                      f"or 0 * sum by (instance) (rate(pdd_router_upstream_requests_total"
                      f"[{RATE}]))) / sum by (instance) (rate(pdd_router_upstream_requests_total"
                      f"[{RATE}]))", "{{instance}}")], at(17, y, 7, 6)),
    ]  # fmt: skip


def build() -> dashboard.Dashboard:
    model = (
        dashboard.QueryVariable("model").label("Model").datasource(DS)
        .query("label_values(pdd_router_requests_total, model)")
        .include_all(True).multi(True).all_value(".*")
    )  # fmt: skip
    board = (
        dashboard.Dashboard("pdd-router").uid("pdd-router").tags(["pdd-router", "llm"])
        .description("The router of a two-datacenter PDD deployment: requests, latencies per "
                     "pipeline, tokens, cache, WAN and the router's own health")
        .refresh("10s").time("now-30m", "now").editable()
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus")
                       .type("prometheus"))
        .with_variable(model)
    )  # fmt: skip
    rows: list[tuple[str, list[object]]] = [
        ("Requests", list(requests_row(1))),
        ("Latency", list(latency_row(10))),
        ("Tokens, cache and WAN", list(tokens_row(19))),
        ("Router", router_row(28)),
    ]
    for title, panels in rows:
        board = board.with_row(dashboard.Row(title))
        for panel in panels:
            board = board.with_panel(panel)  # type: ignore[arg-type]
    return board


def main() -> None:
    text = json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True)
    OUT.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
