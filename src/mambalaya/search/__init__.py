"""Which mapping: the named mappings (unfused, ideal, SSM-RI, stitched, optimal) and the
searches behind them (candidate groups and their closed forms, picking, segments, convex
groups, Pareto fronts). It calls the cost model (:mod:`mambalaya.cost`) through its public
functions only; the memos and tables that serve the search live here."""
