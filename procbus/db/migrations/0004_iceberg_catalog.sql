-- The Apache Iceberg SQL catalog (issue 38): the two tables that pyiceberg's SqlCatalog and
-- Iceberg's JdbcCatalog (its schema "V1", with "iceberg_type") share, column for column, so any
-- engine pointed at this database with the catalog name 'procbus' reads procbus's lake tables.
-- A table's row points at its current metadata file; a commit is a compare-and-set of that
-- pointer, and procbus moves several tables' pointers in one transaction.
CREATE TABLE "iceberg_tables" (
    "catalog_name" varchar(255) NOT NULL,
    "table_namespace" varchar(255) NOT NULL,
    "table_name" varchar(255) NOT NULL,
    "metadata_location" varchar(1000),
    "previous_metadata_location" varchar(1000),
    "iceberg_type" varchar(5),
    PRIMARY KEY ("catalog_name", "table_namespace", "table_name")
);

CREATE TABLE "iceberg_namespace_properties" (
    "catalog_name" varchar(255) NOT NULL,
    "namespace" varchar(255) NOT NULL,
    "property_key" varchar(255) NOT NULL,
    "property_value" varchar(1000) NOT NULL,
    PRIMARY KEY ("catalog_name", "namespace", "property_key")
);
