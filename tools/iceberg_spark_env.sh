#!/usr/bin/env bash
# A virtual environment of its own for reading procbus's tables with Spark and Iceberg's own
# runtime (JdbcCatalog on procbus's PostgreSQL): pyspark 3.5 (Scala 2.12), Iceberg's Spark runtime
# from the PyPI package snowpark-connect-deps-iceberg, Debian's PostgreSQL JDBC driver, and
# Iceberg's shaded Jackson, which that runtime jar lacks, rebuilt from pyspark's own Jackson jars
# with jarjar (../shared/PITFALLS.md). It writes VENV_DIR/iceberg-spark-jars.txt, the jars for
# spark.jars, one absolute path a line. Usage: iceberg_spark_env.sh VENV_DIR [PYTHON]
set -euo pipefail
# Absolute: the jar list is read from other working folders.
venv=$(realpath -m "$1")
python=${2:-python3}
stamp=$venv/.iceberg-spark-ready
jar_list=$venv/iceberg-spark-jars.txt
postgresql_jar=/usr/share/java/postgresql.jar
jarjar_jar=/usr/share/java/jarjar.jar

# The stamp holds this script's hash: an environment built by an older version is rebuilt.
fingerprint=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
jars_present() {
  [ -f "$jar_list" ] || return 1
  while IFS= read -r jar; do [ -f "$jar" ] || return 1; done < "$jar_list"
}
[ "$(cat "$stamp" 2>/dev/null)" = "$fingerprint" ] && jars_present && exit 0

command -v java >/dev/null 2>&1 || {
  echo "Java is missing: Spark and jarjar need a Java 17 runtime."
  echo "Install it, e.g. 'apt-get install -y openjdk-17-jre-headless', then run this again."
  exit 1
}
# snowpark-connect-deps-iceberg's wheel wants Python < 3.13; procbus's reader wants 3.11+.
"$python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))' || {
  echo "$python is Python $("$python" -c 'import sys; print(sys.version.split()[0])'):" \
    "the Iceberg Spark environment needs 3.11 or 3.12."
  echo "Pass another one, e.g. 'make iceberg-spark ICEBERG_SPARK_PYTHON=python3.12'."
  exit 1
}
# Debian's packages: `make iceberg-spark` installs them (as root), this script only checks.
for jar_and_package in "$postgresql_jar libpostgresql-jdbc-java" "$jarjar_jar libjarjar-java"; do
  read -r jar package <<< "$jar_and_package"
  [ -f "$jar" ] && continue
  echo "$jar is missing: the Iceberg Spark environment needs Debian's $package."
  echo "Install it, e.g. 'sudo apt-get install -y $package' (Debian/Ubuntu), or run"
  echo "'make iceberg-spark' as root, then run this again."
  exit 1
done

rm -f "$stamp"
"$python" -m venv "$venv"
# pyspark pinned: the shaded Jackson below is rebuilt from its jars (checked with 3.5.9).
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  'pyspark==3.5.9' 'snowpark-connect-deps-iceberg==1.0.3'
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
runtime=$(find "$site" -name 'iceberg-spark-runtime-3.5_2.12-*.jar' -print -quit)
[ -n "$runtime" ] || { echo "no iceberg-spark-runtime-3.5_2.12 jar in snowpark-connect-deps-iceberg"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Merged with Python's zipfile: a Java runtime has no `jar` tool, and unzip may be missing.
"$venv/bin/python" - "$site/pyspark/jars" "$work/jackson.jar" <<'EOF'
import pathlib, sys, zipfile
jars_folder, merged = pathlib.Path(sys.argv[1]), sys.argv[2]
patterns = ["jackson-core-2.*.jar", "jackson-databind-2.*.jar", "jackson-annotations-2.*.jar",
            "jackson-datatype-jsr310-2.*.jar"]
seen = set()
with zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as out:
    for pattern in patterns:
        found = sorted(jars_folder.glob(pattern))
        if len(found) != 1:
            sys.exit(f"expected one {pattern} in {jars_folder}, found {len(found)}")
        with zipfile.ZipFile(found[0]) as jar:
            for entry in jar.infolist():
                name = entry.filename
                if name.startswith("META-INF/") or name.endswith("module-info.class"):
                    continue
                if name in seen or entry.is_dir():
                    continue
                seen.add(name)
                out.writestr(name, jar.read(name))
EOF
echo 'rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1' \
  > "$work/rules.txt"
java -jar "$jarjar_jar" process "$work/rules.txt" "$work/jackson.jar" \
  "$venv/iceberg-shaded-jackson.jar"

printf '%s\n' "$runtime" "$venv/iceberg-shaded-jackson.jar" "$postgresql_jar" > "$jar_list"
jars_present
echo "$fingerprint" > "$stamp"
echo "Spark 3.5 with Iceberg's runtime ready in $venv"
