-- Where a task is done: a point (WGS 84 degrees) and a radius in metres, an
-- optional address line, and what the agent asks of the positions workers
-- send (presence). `cell` is the point's index cell (a Z-order code of a
-- 2^26 x 2^26 latitude/longitude grid, computed by the server): every
-- coarser cell is one range of codes, so the nearby listing reads the open
-- tasks around a point with a few range scans of the partial index below,
-- whatever the size of the table. The index holds the point and the id
-- too: the listing reads candidates from it alone, measures them, and
-- reads from the table only the rows of the page. (SQLite uses an index
-- alone only when it holds every column the query names, `state` too.)
ALTER TABLE tasks ADD COLUMN latitude REAL;
ALTER TABLE tasks ADD COLUMN longitude REAL;
ALTER TABLE tasks ADD COLUMN radius_m INTEGER;
ALTER TABLE tasks ADD COLUMN address TEXT;
ALTER TABLE tasks ADD COLUMN presence TEXT NOT NULL DEFAULT 'none'
    CHECK (presence IN ('none', 'flag', 'require'));
ALTER TABLE tasks ADD COLUMN cell INTEGER;

CREATE INDEX tasks_open_cell ON tasks (cell, latitude, longitude, id, state) WHERE state = 'open' AND cell IS NOT NULL;

-- Open tasks without a place, oldest first: the end of the nearby listing.
CREATE INDEX tasks_open_unlocated ON tasks (created_at, id)
    WHERE state = 'open' AND cell IS NULL;
