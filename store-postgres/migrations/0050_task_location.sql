-- Where a task is done: a point (WGS 84 degrees) and a radius in metres, an
-- optional address line, and what the agent asks of the positions workers
-- send (presence). `cell` is the point's index cell (a Z-order code of a
-- 2^26 x 2^26 latitude/longitude grid, computed by the server): every
-- coarser cell is one range of codes, so the nearby listing reads the open
-- tasks around a point with a few range scans of the partial index below,
-- whatever the size of the table. The index holds the point and the id
-- too: the listing reads candidates from it alone, measures them, and
-- reads from the table only the rows of the page.
ALTER TABLE tasks
    ADD COLUMN latitude  double precision,
    ADD COLUMN longitude double precision,
    ADD COLUMN radius_m  integer,
    ADD COLUMN address   text,
    ADD COLUMN presence  text NOT NULL DEFAULT 'none'
        CHECK (presence IN ('none', 'flag', 'require')),
    ADD COLUMN cell      bigint,
    ADD CONSTRAINT tasks_location_whole CHECK (
        (latitude IS NULL) = (longitude IS NULL)
        AND (latitude IS NULL) = (radius_m IS NULL)
        AND (latitude IS NULL) = (cell IS NULL)
    );

CREATE INDEX tasks_open_cell ON tasks (cell) INCLUDE (latitude, longitude, id) WHERE state = 'open' AND cell IS NOT NULL;

-- Open tasks without a place, oldest first: the end of the nearby listing.
CREATE INDEX tasks_open_unlocated ON tasks (created_at, id)
    WHERE state = 'open' AND cell IS NULL;
