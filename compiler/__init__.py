"""The qdc compiler: front end, IR, passes, codegen. Imported lazily by `qdc`."""
