# The HTML report: one self-contained page (plotly.js inlined, works offline) of the
# report JSON, next to it (torq_gen_config_<model>.html). Not part of `rule all`:
# ask for it with `snakemake --cores 1 report_html`, or `torq-gen-config report`.
# Flagged for `snakemake --report` (caption: rules/captions/html_report.rst).


rule report_html:
    input:
        report=ctx.report,
        compiler=ctx.compiler_json,
    output:
        html=report(ctx.html_report, caption="captions/html_report.rst", category="Discovery"),
    log:
        ctx.log("report_html.log"),
    run:
        steps.report_html.report_html(input, output, params, log)
