# The HTML report: one self-contained page (plotly.js inlined, works offline) of the
# report JSON, next to it (torq_gen_config_<model>.html). Not part of `rule all`:
# ask for it with `snakemake --cores 1 report_html`, or `torq-gen-config report`.
# Flagged for `snakemake --report` (caption: rules/captions/html_report.rst).


HTML_REPORT = os.path.normpath(os.path.join(OUT, layout.html_report_file(MODEL_NAME)))


rule report_html:
    input:
        report=REPORT,
        compiler=COMPILER_JSON,
    output:
        html=report(HTML_REPORT, caption="captions/html_report.rst", category="Discovery"),
    log:
        os.path.join(LOGS, "report_html.log"),
    run:
        steps.report_html.report_html(input, output, params, log)
