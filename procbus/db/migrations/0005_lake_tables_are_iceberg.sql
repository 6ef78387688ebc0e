-- Lake tables are Apache Iceberg tables (0004): a table's snapshots and files are its Iceberg
-- metadata, so procbus's own lists of them go. A table made before 0004 has no Iceberg metadata,
-- and SQL cannot write metadata files: such a database is refused, saying what to do, before
-- anything is dropped (the whole migration is one transaction).
DO $$
BEGIN
    IF EXISTS (
        SELECT FROM "procbus_tables" AS t
        WHERE NOT EXISTS (
            SELECT FROM "iceberg_tables" AS i
            WHERE i."catalog_name" = 'procbus' AND i."table_namespace" = t."namespace"
              AND i."table_name" = t."name"
        )
    ) THEN
        RAISE EXCEPTION 'this database holds lake tables of procbus''s former table format, '
            'which Iceberg readers cannot read and this version cannot convert: with the '
            'previous version, read their rows out (procbus table read) and delete them, then '
            'migrate and load them again; or start from an empty database';
    END IF;
END $$;

DROP TABLE "procbus_table_files";
DROP TABLE "procbus_snapshots";
ALTER TABLE "procbus_tables" DROP COLUMN "current_snapshot";
