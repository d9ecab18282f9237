"""A call-dense third-party program: sqlglot parsing and transpiling SQL between dialects.

    python sqlglot_transpile.py [ROUNDS]

Each round transpiles every statement below from its dialect into three others and
pretty-prints one. ~1 s untraced at the default 14 rounds on the bench machine. It marks its
first line, the end of its import of sqlglot, each round's end and its last line
(_marks.py): bench/bench_phases.py splits a run with them.
"""

import sys

from _marks import mark

mark("start")

import sqlglot  # noqa: E402

mark("imported")

STATEMENTS = [
    ("duckdb", "SELECT a, SUM(b) AS total FROM t JOIN u ON t.id = u.id WHERE c > 1 "
               "GROUP BY a HAVING SUM(b) > 10 ORDER BY 2 DESC LIMIT 10"),
    ("postgres", "WITH recent AS (SELECT user_id, MAX(created_at) AS last_seen FROM events "
                 "WHERE created_at > NOW() - INTERVAL '7 days' GROUP BY user_id) "
                 "SELECT u.name, r.last_seen FROM users AS u LEFT JOIN recent AS r "
                 "ON u.id = r.user_id WHERE u.active"),
    ("mysql", "SELECT IFNULL(price, 0) * qty AS amount, DATE_FORMAT(sold, '%Y-%m') AS month "
              "FROM sales WHERE region IN ('north', 'south') AND qty BETWEEN 1 AND 100"),
    ("spark", "SELECT dept, name, salary, RANK() OVER (PARTITION BY dept ORDER BY salary DESC) "
              "AS rnk FROM staff WHERE salary IS NOT NULL"),
    ("bigquery", "SELECT id, ARRAY_LENGTH(tags) AS n, SAFE_CAST(score AS INT64) AS s "
                 "FROM `proj.ds.items` WHERE STARTS_WITH(name, 'x') QUALIFY "
                 "ROW_NUMBER() OVER (PARTITION BY id ORDER BY s DESC) = 1"),
    ("snowflake", "SELECT o.id, CASE WHEN o.total > 100 THEN 'big' WHEN o.total > 10 "
                  "THEN 'mid' ELSE 'small' END AS size, COALESCE(c.name, 'anon') "
                  "FROM orders AS o LEFT JOIN customers AS c ON o.cust = c.id "
                  "WHERE o.ts >= '2024-01-01' UNION ALL SELECT 0, 'none', 'none'"),
    ("tsql", "SELECT TOP 5 name, LEN(name) AS l FROM people WHERE name LIKE 'A%' "
             "ORDER BY l"),
    ("sqlite", "INSERT INTO log (ts, level, msg) SELECT ts, 'warn', msg FROM staging "
               "WHERE level > 2 AND msg <> ''"),
]

TARGETS = ["duckdb", "postgres", "spark", "snowflake", "mysql"]


def run(rounds: int) -> int:
    size = 0
    for _ in range(rounds):
        for dialect, sql in STATEMENTS:
            for target in TARGETS:
                if target != dialect:
                    size += len(sqlglot.transpile(sql, read=dialect, write=target)[0])
        size += len(sqlglot.transpile(STATEMENTS[1][1], read="postgres", pretty=True)[0])
        mark("round")
    return size


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 14))
    mark("end")
