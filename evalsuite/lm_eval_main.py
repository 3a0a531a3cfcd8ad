"""lm-eval's own command line with our model registered: ``python -m evalsuite.lm_eval_main run --model evalsuite
--model_args model=fox-pro-tiny,device=cpu --tasks ...`` (every ``lm_eval`` option works).

The plain ``lm_eval`` command cannot see the ``evalsuite`` model: lm-eval finds models only in its registry,
which outside classes join when their module is imported, and it imports no outside modules (its
``--include_path`` reads task YAML only). This entry point imports the bridge, then hands over to lm-eval.
"""

from __future__ import annotations


def main() -> None:
    """lm-eval's command line; our bad-input errors (a wrong model spec, no GPU for lm-eval's default ``--device
    cuda:0``) are one ``error: ...`` line and exit status 2, as in ``evalsuite``."""
    import sys

    from evalsuite.errors import UserError, require

    try:
        require("lm_eval", "lm-eval", "python -m evalsuite.lm_eval_main")
        from lm_eval.__main__ import cli_evaluate

        import evalsuite.adapters.lm_eval_bridge  # noqa: F401 - registers the "evalsuite" model with lm-eval

        cli_evaluate()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
